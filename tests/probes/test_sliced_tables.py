"""A loop written by hand that slices its batches from tables made before it (``xb, yb = X[idx],
y[idx]``): the replay cannot leave rows out of a batch the step makes itself, so it overwrites the
tables' typo rows with a clean row and reruns the window (the tables the user holds untouched)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

#: linear regression by hand, minibatches of 32 drawn through a permutation, plain SGD; a typo
#: ({where} = 1e5) sits in row 139 of the features or of the target, met at the fourth update
SLICED = """
import numpy as np
import torch

torch.manual_seed(5)
rng = np.random.default_rng(7)
n, d = 512, 3
X = rng.normal(size=(n, d))
y = X @ rng.normal(size=d) + 0.1 * rng.normal(size=n)
{where} = 1e5
X = torch.tensor(X, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.float32).unsqueeze(1)
kept_X, kept_y = X.clone(), y.clone()
w = (torch.randn(d, 1) / d ** 0.5).requires_grad_()
b = torch.zeros(1, requires_grad=True)
lr = 0.04
try:
    for epoch in range(3):
        perm = torch.randperm(n)
        for start in range(0, n, 32):
            idx = perm[start:start + 32]
            xb, yb = X[idx], y[idx]
            loss = ((xb @ w + b - yb) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                for p in (w, b):
                    p -= lr * p.grad
                    p.grad.zero_()
finally:
    print("tables untouched:", torch.equal(X, kept_X) and torch.equal(y, kept_y))
"""


def _without_rows(d: dict) -> dict:  # type: ignore[type-arg]
    return next(c for c in d["confirmation"]
                if c.get("change") == "without_rows" and c.get("scope") == "window")


@pytest.mark.slow
@pytest.mark.parametrize(("where", "table"), [("y[139]", "y"), ("X[139, 1]", "X")])
def test_a_typo_in_a_table_the_step_slices_is_found_by_the_replay(tmp_path, where: str,
                                                                   table: str) -> None:  # fmt: skip
    from tests.torch.test_torch_autowatch import _run

    proc, d = _run(tmp_path, SLICED.format(where=where))
    assert d is not None, proc.stderr
    assert "tables untouched: True" in proc.stdout
    assert d["cause"] == "extreme_batch", d["evidence"]
    entry = _without_rows(d)
    assert entry["fixed"] is True
    assert f"[139] of {table} (the table the step slices its batches from" in entry["text"]
    # the lr cuts do not cure it: the row's error dominates any step
    lr_cuts = [c for c in d["confirmation"] if str(c.get("change")).startswith("lr_x")]
    assert lr_cuts and not any(c["fixed"] for c in lr_cuts)


@pytest.mark.slow
def test_clean_tables_give_no_rows_experiment(tmp_path) -> None:
    # the same loop diverging by its step size alone (lr 1.2 on standardised data, no typo):
    # the tables hold no row to overwrite, and a smaller step is what cures it
    from tests.torch.test_torch_autowatch import _run

    script = SLICED.format(where="X[0, 0]").replace("= 1e5", "= 0.5").replace(
        "lr = 0.04", "lr = 1.2")
    proc, d = _run(tmp_path, script)
    assert d is not None, proc.stderr
    assert not any(c.get("change") == "without_rows" for c in d["confirmation"] or [])
    assert d["cause"] == "step_size_too_large", d["evidence"]
