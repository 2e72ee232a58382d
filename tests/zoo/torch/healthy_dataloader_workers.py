"""A regression MLP fed by a ``DataLoader`` with ``num_workers=2`` (worker processes), shuffling,
``drop_last``, Adam, three epochs, the usual ``main()`` under ``if __name__ == "__main__"``.

The batches come from worker processes; nanscope watches the training process only and must
neither break the workers nor mistake their batches. The loss falls; nothing to report.
"""

import os

from torch.utils.data import DataLoader, Dataset

import torch
from torch import nn

CAUSE = "healthy"


class Regression(Dataset):
    def __init__(self, n: int = 512) -> None:
        g = torch.Generator().manual_seed(int(os.environ.get("ZOO_SEED", "0")))
        self.x = torch.randn(n, 6, generator=g)
        noise = 0.05 * torch.randn(n, 1, generator=g)
        self.y = torch.sin(self.x[:, :1]) + 0.5 * self.x[:, 1:2] + noise

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(int(os.environ.get("ZOO_SEED", "0")))
    loader = DataLoader(Regression(), batch_size=32, shuffle=True, num_workers=2, drop_last=True)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.MSELoss()
    for epoch in range(3):
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
