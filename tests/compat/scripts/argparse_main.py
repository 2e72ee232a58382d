"""argparse and an if __name__ == "__main__" guard; the options come from the command line."""
import argparse

import torch
from torch import nn


def parse():
    parser = argparse.ArgumentParser(description="tiny regression")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--name", default="run")
    return parser.parse_args()


def main():
    args = parse()
    torch.manual_seed(0)
    X, y = torch.randn(32, 4), torch.randn(32, 1)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), y)
        loss.backward()
        opt.step()
    print(f"{args.name} steps {args.steps} lr {args.lr} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
