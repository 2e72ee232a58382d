"""torch.optim.swa_utils: AveragedModel (a deep copy), SWALR, update_bn."""
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 4), torch.randn(64, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=16)
model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
swa = AveragedModel(model)
sched = SWALR(opt, swa_lr=0.02)
for _ in range(3):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
    swa.update_parameters(model)
    sched.step()
update_bn(loader, swa)
with torch.no_grad():
    print(f"swa loss {nn.functional.mse_loss(swa(X), y).item():.6f}")
torch.save(swa.state_dict(), "swa.pt")
print("saved", len(torch.load("swa.pt", weights_only=True)))
