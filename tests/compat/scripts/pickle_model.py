"""pickle.dumps of a trained model and of its optimizer; the copies train on."""
import pickle

import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(32, 3), torch.randn(32, 1)
model = nn.Linear(3, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for _ in range(8):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X), y)
    loss.backward()
    opt.step()
blob = pickle.dumps(model)
copy = pickle.loads(blob)
state = pickle.loads(pickle.dumps(opt.state_dict()))
opt2 = torch.optim.Adam(copy.parameters(), lr=0.01)
opt2.load_state_dict(state)
print("state steps", [int(s["step"]) for s in state["state"].values()])
print("same", torch.equal(copy(X), model(X)))
print(f"loss {loss.item():.6f}")
