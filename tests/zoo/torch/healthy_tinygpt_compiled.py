"""``healthy_tinygpt_adamw`` with the model compiled as nanoGPT compiles it (``torch.compile``
after the optimizer is made), at the same sane peak learning rate of 1e-2.

The compiler traces the model's forward hooks into its graph; the fit must train as it does
eagerly and be called healthy, every update watched.
"""

from _tinygpt import train

CAUSE = "healthy"

train(learning_rate=1e-2, compile=True)
