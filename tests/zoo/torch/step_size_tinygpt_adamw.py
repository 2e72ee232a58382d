"""A character-level GPT trained like nanoGPT (AdamW, warm-up, cosine decay, gradient
accumulation, ``clip_grad_norm_`` at 1.0) at a peak learning rate of 3.0, 300x the 1e-2 this
model trains well at (``healthy_tinygpt_adamw``).

AdamW normalises the step, so the loss does not grow geometrically to inf: once the warm-up
brings the lr past ~1, each update moves every weight by ~lr, the loss jumps from ~3.5 (per
micro-batch 1.7) to a plateau 5-30x above its best within a few updates, and stays there while
the lr stays high. Clipping bounds the gradient, not Adam's step, so it does not help.
"""

from _tinygpt import train

CAUSE = "step_size_too_large"

train(learning_rate=3.0)
