"""A nanoGPT-style loop with gradient accumulation: each update sums the gradients of four
micro-batches, each loss divided by 4 before ``backward()`` (so the update applies the gradient
of the batch's mean loss), then ``clip_grad_norm_`` and one AdamW step. argv[1] is the lr.

With NANSCOPE_TEST_LOSS_OUT set it appends, per update, the loss the script itself would log
for the update (the mean of the four undivided micro-batch losses) to that file.
"""

import os
import sys

import torch

lr = float(sys.argv[1]) if len(sys.argv) > 1 else 1e-2
accum = 4
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 8, generator=g)
y = (x @ torch.randn(8, 3, generator=g)).argmax(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
opt = torch.optim.AdamW(model.parameters(), lr=lr)
out = os.environ.get("NANSCOPE_TEST_LOSS_OUT")
for _update in range(100):
    logged = 0.0
    for _micro in range(accum):
        idx = torch.randint(0, 512, (16,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss = loss / accum  # scale the loss to account for gradient accumulation
        logged += loss.item()
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if out:
        with open(out, "a") as fh:
            fh.write(f"{os.environ.get('NANSCOPE_LR_FACTOR')} {logged!r}\n")
