"""torch.func: per-sample gradient norms with vmap(grad(functional_call)) down-weight the samples
with the largest gradients, then an ordinary backward and step."""
from torch.func import functional_call, grad, vmap

import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def sample_loss(params, buffers, x, t):
    out = functional_call(model, (params, buffers), (x.unsqueeze(0),))
    return nn.functional.mse_loss(out, t.unsqueeze(0))


per_sample = vmap(grad(sample_loss), in_dims=(None, None, 0, 0))
for _ in range(8):
    params = {k: v.detach() for k, v in model.named_parameters()}
    grads = per_sample(params, dict(model.named_buffers()), X, y)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()]).norm(dim=0)
    weights = 1.0 / norms.clamp(min=1.0)
    opt.zero_grad()
    per = nn.functional.mse_loss(model(X), y, reduction="none").squeeze(1)
    loss = (per * weights).mean()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f} max norm {norms.max().item():.4f}")
