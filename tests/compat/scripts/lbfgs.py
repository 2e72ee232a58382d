"""LBFGS with a closure (several forward/backward per step), strong Wolfe line search."""
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(64, 3)
y = X @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.1 * torch.randn(64, 1)
model = nn.Linear(3, 1)
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, line_search_fn="strong_wolfe")


def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    return loss


for _ in range(4):
    loss = opt.step(closure)
print(f"loss {loss.item():.6f}")
