"""``step_size_tinygpt_adamw`` with the model compiled as nanoGPT compiles it: the same GPT,
warm-up, cosine decay, accumulation and clipping, at a peak learning rate of 3.0.

The loss jumps to a plateau 5-30x above its best once the warm-up passes lr ~1 (AdamW's step is
~lr per weight, clipping does not bound it); compiled, the cause and the update it shows at must
be those of the eager fit.
"""

from _tinygpt import train

CAUSE = "step_size_too_large"

train(learning_rate=3.0, compile=True)
