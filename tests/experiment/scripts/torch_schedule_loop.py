"""A least-squares fit whose script sets the lr itself before every step, as GPT trainers do.

The loop computes a linear warm-up then cosine decay from its own ``learning_rate`` and writes it
into every param group each iteration (``param_group["lr"] = lr``). With ``lambdalr`` as argv[2]
it uses ``torch.optim.lr_scheduler.LambdaLR`` for the same schedule instead. argv[1] is the peak
lr; 0.1 diverges, 0.01 descends.
"""

import math
import sys

import torch

learning_rate = float(sys.argv[1]) if len(sys.argv) > 1 else 0.1
use_scheduler = len(sys.argv) > 2 and sys.argv[2] == "lambdalr"
warmup_iters, max_iters = 10, 200


def get_lr(it: int) -> float:
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return 0.1 * learning_rate + 0.45 * learning_rate * (1.0 + math.cos(math.pi * ratio))


g = torch.Generator().manual_seed(0)
x = torch.randn(128, 4, generator=g) * torch.tensor([1.0, 3.0, 5.0, 8.0])
y = x @ torch.tensor([1.0, -2.0, 0.5, 0.25]) + 0.1 * torch.randn(128, generator=g)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
scheduler = None
if use_scheduler:
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: get_lr(it) / learning_rate
    )
for it in range(max_iters):
    if scheduler is None:
        lr = get_lr(it)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    loss.backward()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    if it % 10 == 0:
        print(f"iter {it}: loss {loss.item():.4f}")
