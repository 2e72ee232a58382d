"""A tiny PyTorch least-squares fit whose SGD learning rate (argv[1]) is too large: it diverges.

With NANSCOPE_TEST_LR_OUT set it appends the learning rates its two param groups step with (the
bias group has its own lr, half the default) to that file, so a test can see the sweep's scaling.
"""

import os
import sys

import torch

lr = float(sys.argv[1]) if len(sys.argv) > 1 else 0.1
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 4, generator=g) * torch.tensor([1.0, 3.0, 5.0, 8.0])
y = x @ torch.tensor([1.0, -2.0, 0.5, 0.25]) + 0.1 * torch.randn(128, generator=g)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": lr / 2}], lr=lr)
recorded: list[float] = []  # the first step's lrs, once written


def record_lrs(optimizer, args, kwargs):
    """The lrs the first step applies (a sweep scales them for each step, then puts them back)."""
    if os.environ.get("NANSCOPE_TEST_LR_OUT") and not recorded:
        recorded.extend(group["lr"] for group in optimizer.param_groups)
        with open(os.environ["NANSCOPE_TEST_LR_OUT"], "a") as fh:
            groups = " ".join(repr(value) for value in recorded)
            fh.write(f"{os.environ.get('NANSCOPE_LR_FACTOR')} {groups}\n")


opt.register_step_pre_hook(record_lrs)
for update in range(200):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    loss.backward()
    opt.step()
    print(f"update {update + 1} loss {loss.item():.4g}")
