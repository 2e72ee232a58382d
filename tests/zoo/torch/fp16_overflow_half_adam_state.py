"""A hand-written Adam that keeps its moment estimates in float16 "to halve the optimizer's
memory", on a linear model of house prices fitted in raw units (square feet, dollars).

The model and its gradients are float32 and finite: the gradient of the area weight is about
1e9. Adam is scale-free, so the same fit with ``torch.optim.Adam`` runs; but this optimizer adds
``(1 - beta1) * grad`` into a float16 buffer, past 65504: the first moment is inf, ``m / sqrt(v)``
is inf / inf = NaN and the first step writes NaN into every weight.
"""

import os

import torch
from torch import nn

CAUSE = "fp16_overflow"
OP = "add"


class HalfStateAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["t"] = 0
                    state["m"] = torch.zeros_like(p, dtype=torch.float16)
                    state["v"] = torch.zeros_like(p, dtype=torch.float16)
                state["t"] += 1
                m, v, t = state["m"], state["v"], state["t"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = m.float() / (1 - b1**t)
                v_hat = v.float() / (1 - b2**t)
                p.add_(-group["lr"] * m_hat / (v_hat.sqrt() + group["eps"]))


torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
n = 512
area = 1500 + 500 * torch.randn(n)
rooms = torch.randint(1, 7, (n,)).float()
age = 100 * torch.rand(n)
X = torch.stack([area, rooms, age], dim=1)
price = (150 * area + 10_000 * rooms - 500 * age + 20_000 * torch.randn(n)).unsqueeze(1)
model = nn.Linear(3, 1)
opt = HalfStateAdam(model.parameters(), lr=1.0)
for i in range(0, n, 64):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X[i : i + 64]), price[i : i + 64])
    loss.backward()
    opt.step()
print("done", loss.item())
