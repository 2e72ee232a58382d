"""Parameter groups: no weight decay on biases and norms, a smaller lr for the first layer,
a group added later with add_param_group."""
import torch
from torch import nn

torch.manual_seed(0)
X, y = torch.randn(64, 5), torch.randn(64, 1)
model = nn.Sequential(nn.Linear(5, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 8))
extra = nn.Linear(8, 1)
decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                         {"params": rest, "weight_decay": 0.0, "lr": 3e-3}], lr=1e-2)
for step in range(12):
    if step == 4:
        opt.add_param_group({"params": extra.parameters(), "lr": 5e-3})
    opt.zero_grad()
    loss = nn.functional.mse_loss(extra(torch.relu(model(X))), y)
    loss.backward()
    opt.step()
print("groups", len(opt.param_groups), [g["lr"] for g in opt.param_groups])
print(f"loss {loss.item():.6f}")
