"""A character-level GPT trained like nanoGPT (AdamW, warm-up, cosine decay, gradient
accumulation, ``clip_grad_norm_`` at 1.0) at a sane peak learning rate of 1e-2.

The loss falls from ~3.5 to ~1.4 per character (minibatch noise on top); the same script at 300x
the learning rate is ``step_size_tinygpt_adamw``.
"""

from _tinygpt import train

CAUSE = "healthy"

train(learning_rate=1e-2)
