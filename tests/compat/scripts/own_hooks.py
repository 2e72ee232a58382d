"""The script's own forward pre/post hooks, full backward hook and tensor hook."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
seen = {"pre": 0, "post": 0, "bwd": 0, "tensor": 0}


def pre(module, args):
    seen["pre"] += 1
    return (args[0] * 1.0,)


def post(module, args, out):
    seen["post"] += 1
    return out


def bwd(module, grad_in, grad_out):
    seen["bwd"] += 1


def on_grad(g):
    seen["tensor"] += 1
    return g


model.register_forward_pre_hook(pre)
model[0].register_forward_hook(post)
model[2].register_full_backward_hook(bwd)
model[0].weight.register_hook(on_grad)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(6):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
print("hooks", seen)
print(f"loss {loss.item():.6f}")
