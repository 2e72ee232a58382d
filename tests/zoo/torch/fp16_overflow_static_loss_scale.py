"""A half-precision classifier trained with a hand-rolled *static* loss scale of 2**24 (copied
from a recipe meant for a dynamic scaler) and no GradScaler. The loss is computed in float32
(``log_softmax`` of the logits cast up) and is finite; ``(loss * 2**24).backward()`` sends
gradients of about 1e6 into the float16 model, past 65504: inf in the backward. Unscaled, or with
the model in float32, the gradients are finite.
"""

import torch
from torch import nn

CAUSE = "fp16_overflow"
OP = "ToCopyBackward0"  # the float32 -> float16 cast of the logits, in the backward

LOSS_SCALE = 2.0**24

torch.set_num_threads(1)
torch.manual_seed(0)
X = torch.randn(128, 20).half()
y = torch.randint(0, 5, (128,))
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for _step in range(10):
    opt.zero_grad()
    logits = model(X).float()
    loss = nn.functional.nll_loss(torch.log_softmax(logits, dim=-1), y)
    (loss * LOSS_SCALE).backward()
    for p in model.parameters():
        p.grad.div_(LOSS_SCALE)
    opt.step()
print("done", loss.item())
