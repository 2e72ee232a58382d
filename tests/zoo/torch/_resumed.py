"""Least squares resumed from its fitted weights (a checkpoint) and trained on with
``torch.optim.SGD`` at ``factor`` x the stability limit 2/L of its stiffest direction (one feature
4x the others), batches of 1024 of 2048 rows: ``train(factor)``."""

import os

import torch


def train(factor: float, steps: int = 600) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    g = torch.Generator().manual_seed(int(os.environ.get("ZOO_SEED", "0")))
    n, d, batch = 2048, 6, 1024
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.tensor([1, 1, 1, 1, 1, 4.0])
    w_true = torch.tensor([1.0, -0.5, 0.8, 0.3, -1.2, 0.02], dtype=torch.float64)
    y = X @ w_true + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    L = float(torch.linalg.eigvalsh(2 * X.T @ X / n).max())
    model = torch.nn.Linear(d, 1, bias=False).double()
    with torch.no_grad():  # the checkpoint: the least-squares fit, a hair off
        model.weight.copy_(torch.linalg.lstsq(X, y.unsqueeze(1)).solution.T)
        model.weight.add_(0.003 * torch.randn(1, d, generator=g, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=factor * 2.0 / L)
    for step in range(steps):
        idx = torch.randperm(n, generator=g)[:batch]
        loss = torch.nn.functional.mse_loss(model(X[idx]).squeeze(1), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}")
