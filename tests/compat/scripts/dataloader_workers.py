"""A DataLoader with two persistent workers, shuffled, over two epochs."""
from torch.utils.data import DataLoader, Dataset

import torch
from torch import nn


class Squares(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, i):
        x = torch.tensor([i / 96.0, (i % 7) / 7.0])
        return x, (x ** 2).sum(0, keepdim=True)


def main():
    torch.manual_seed(0)
    loader = DataLoader(Squares(), batch_size=16, shuffle=True, num_workers=2,
                        persistent_workers=True)
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(2):
        total = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch} loss {total:.6f}")


if __name__ == "__main__":
    main()
