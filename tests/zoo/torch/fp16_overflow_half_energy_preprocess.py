"""A keyword spotter trained in pure half precision (``model.half()``, batches cast with
``.half()`` in the loop, no autocast, no GradScaler). The loop computes a log-energy feature
from the raw 16-bit PCM samples: ``torch.log((wave * wave).mean(-1))``.

The samples go up to about 20000; in float16 their square passes 65504 and is inf, the energy
feature is inf and the first loss is NaN. In float32 the square is about 4e8, finite. The data
and the model are fine: the preprocessing ran in a dtype too narrow for it.
"""

import os

import torch
from torch import nn

CAUSE = "fp16_overflow"
OP = "mul"

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
n, length = 512, 400
labels = torch.randint(0, 4, (n,))
t = torch.arange(length) / 8000.0
pitch = torch.tensor([300.0, 450.0, 700.0, 1100.0])[labels]
loudness = 4000 + 16000 * torch.rand(n, 1)
wave = (loudness * torch.sin(2 * torch.pi * pitch[:, None] * t)
        + 500 * torch.randn(n, length)).clamp(-32768, 32767).to(torch.int16)
model = nn.Sequential(nn.Linear(41, 64), nn.ReLU(), nn.Linear(64, 4)).half()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for i in range(0, n, 64):
    xb, yb = wave[i : i + 64].half(), labels[i : i + 64]
    energy = (xb * xb).mean(-1, keepdim=True)
    feats = torch.cat([xb[:, ::10] / 32768, torch.log(energy) / 20], dim=-1)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(feats).float(), yb)
    loss.backward()
    opt.step()
print("done", loss.item())
