"""Lint throughput: one 50,000-line file and a tree of files, against plain ``ast.parse``.

Run: ``python bench/lint.py``. Prints files/second and lines/second for ``nanscope lint`` and the
ratio of its time to the time ``ast.parse`` alone takes on the same files, measured in this run.
"""

from __future__ import annotations

import ast
import sys
import tempfile
import time
from pathlib import Path

from nanscope.lint import lint_paths

BLOCK = """
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.fc(x))
        return torch.sigmoid(h)


def step{i}(model, x, y, w, g, lr=0.1):
    p = model(x)
    loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
    n = x.norm(dim=-1, keepdim=True)
    unit = x / (n + 1e-8)
    q = np.clip(p.detach().numpy(), 1e-7, 1 - 1e-7)
    w -= lr * g
    for k in range(3):
        z = x @ w + k
        e = np.exp(z - z.max())
    return loss, unit, q, e
"""


def make_big(lines: int) -> str:
    parts: list[str] = []
    count = i = 0
    while count < lines:
        chunk = BLOCK.format(i=i)
        parts.append(chunk)
        count += chunk.count("\n")
        i += 1
    return "".join(parts)


def timed(func: object, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        func()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        big = root / "big.py"
        big.write_text(make_big(50_000))
        tree = root / "tree"
        for j in range(200):
            sub = tree / f"pkg{j % 10}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"mod{j}.py").write_text(make_big(250))
        (tree / ".gitignore").write_text("ignored/\n")
        (tree / "ignored").mkdir()
        (tree / "ignored" / "skip.py").write_text(make_big(250))

        for label, paths in (("one 50k-line file", [big]), ("tree of 200 files", [tree])):
            files = (
                sorted(big.parent.glob("big.py"))
                if label.startswith("one")
                else sorted(p for p in tree.rglob("*.py") if "ignored" not in p.parts)
            )
            sources = [p.read_text() for p in files]
            n_lines = sum(s.count("\n") for s in sources)
            baseline = timed(lambda sources=sources: [ast.parse(s) for s in sources])
            report = lint_paths(paths)
            assert len(report.files) == len(files), (len(report.files), len(files))
            lint_time = timed(lambda paths=paths: lint_paths(paths))
            print(f"{label}: {len(files)} files, {n_lines} lines, {len(report.findings)} findings")
            print(
                f"  nanscope lint : {lint_time:.3f} s  {len(files) / lint_time:10.1f} files/s"
                f"  {n_lines / lint_time:12.0f} lines/s"
            )
            print(
                f"  ast.parse only: {baseline:.3f} s  {len(files) / baseline:10.1f} files/s"
                f"  {n_lines / baseline:12.0f} lines/s"
            )
            print(f"  ratio lint / ast.parse: {lint_time / baseline:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
