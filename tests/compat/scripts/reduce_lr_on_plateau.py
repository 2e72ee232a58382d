"""ReduceLROnPlateau on a validation loss, with a StepLR-free loop; the lr drops during the run."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 4), torch.randn(64, 1)
Xv, yv = torch.randn(32, 4), torch.randn(32, 1)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
for epoch in range(8):
    for i in range(0, 64, 16):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X[i:i + 16]), y[i:i + 16])
        loss.backward()
        opt.step()
    with torch.no_grad():
        val = nn.functional.mse_loss(model(Xv), yv).item()
    sched.step(val)
    print(f"epoch {epoch} val {val:.6f} lr {opt.param_groups[0]['lr']:.5f}")
