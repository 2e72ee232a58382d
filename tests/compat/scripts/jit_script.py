"""torch.jit.script twice: a module scripted before training and trained, and a trained eager
model scripted for deployment, saved and loaded."""
import warnings

import torch
from torch import nn

warnings.filterwarnings("ignore", category=DeprecationWarning)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.shape[0] > 1:
            h = h * 1.0
        return self.b(h)


def fit(model, steps=10):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
    return loss.item()


torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randn(32, 1)
scripted = torch.jit.script(Net())
print(f"scripted then trained {fit(scripted):.6f}")
eager = Net()
print(f"eager {fit(eager):.6f}")
deployed = torch.jit.script(eager)
torch.jit.save(deployed, "scripted.pt")
print("same", torch.allclose(torch.jit.load("scripted.pt")(X), eager(X)))
