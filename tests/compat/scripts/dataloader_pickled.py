"""A DataLoader pickled with the rest of the training state after an epoch, and deep-copied for
a second pass; its sampler is still a BatchSampler."""
import copy
import pickle

from torch.utils.data import BatchSampler, DataLoader, TensorDataset

import torch
from torch import nn

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
loader = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for xb, yb in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    opt.step()
state = pickle.loads(pickle.dumps({"loader": loader, "opt": opt.state_dict()}))
again = copy.deepcopy(loader)
sampler = loader.batch_sampler
print("sampler", type(sampler).__name__, isinstance(sampler, BatchSampler))
print("batches", len(list(state["loader"])), len(list(again)))
print(f"loss {loss.item():.6f}")
