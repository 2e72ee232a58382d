"""Every rule has its fixture; each fixture flags exactly its expected lines (the docs of every
rule family are checked in tests/docs/test_rule_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nanscope.lint import RULES, lint_file, lint_source

FIXTURES = Path(__file__).parent / "fixtures"
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


def expected(path: Path) -> set[tuple[int, str]]:
    out: set[tuple[int, str]] = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            out.update((number, code.strip()) for code in match.group(1).split(",") if code.strip())
    return out


FIXTURE_FILES = sorted(FIXTURES.glob("L[0-9][0-9][0-9]*.py"))


@pytest.mark.parametrize("code", list(RULES))
def test_rule_has_fixture_with_bad_and_good_cases(code: str) -> None:
    path = FIXTURES / f"{code}.py"
    assert path.is_file(), f"{code} has no fixture {path}"
    exp = expected(path)
    assert any(c == code for _, c in exp), f"{path} marks no '# expect: {code}' line"
    flagged_lines = {line for line, _ in exp}
    total = len(path.read_text().splitlines())
    assert total - len(flagged_lines) > 5, f"{path} has too few good (unflagged) cases"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[p.name for p in FIXTURE_FILES])
def test_fixture_flags_exactly_the_expected_lines(path: Path) -> None:
    got = {(f.line, f.code) for f in lint_file(path)}
    exp = expected(path)
    assert got - exp == set(), f"flagged but not expected: {sorted(got - exp)}"
    assert exp - got == set(), f"expected but not flagged: {sorted(exp - got)}"


def test_codes_are_stable_and_unique() -> None:
    codes = list(RULES)
    assert codes == sorted(codes)
    assert all(re.fullmatch(r"L\d{3}", c) for c in codes)
    assert len({r.name for r in RULES.values()}) == len(codes)
    for code, rule in RULES.items():
        assert rule.code == code
        module = rule.__module__.rsplit(".", 1)[-1]
        assert module.startswith(code + "_"), f"{code} lives in {module}"


def test_alias_tracking_follows_assignments() -> None:
    src = (
        "import torch\n"
        "def f(z):\n"
        "    p = torch.sigmoid(z)\n"
        "    loss = -torch.log(p)\n"
        "    q = torch.sigmoid(z).clamp(1e-7, 1 - 1e-7)\n"
        "    ok = -torch.log(q)\n"
        "    return loss, ok\n"
    )
    assert [(f.line, f.code) for f in lint_source(src)] == [(4, "L001")]


def test_reassignment_is_flow_sensitive() -> None:
    src = (
        "import numpy as np\n"
        "def f(z):\n"
        "    p = 1 / (1 + np.exp(-z))\n"
        "    p = np.clip(p, 1e-12, 1 - 1e-12)\n"
        "    return np.log(p)\n"
    )
    assert lint_source(src) == []


HEALTHY_TORCH = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 3)
        self.rnn = nn.LSTM(64, 64)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def train(loader, epochs=3, lr=1e-3):
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    crit = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(x)
                loss = crit(logits, y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            if not torch.isfinite(loss):
                raise FloatingPointError("loss is not finite")
        with torch.no_grad():
            probs = F.softmax(logits, dim=-1)
            acc = (probs.argmax(-1) == y).float().mean()
            emb = F.normalize(logits, dim=-1)
    return model, acc, emb
"""

HEALTHY_NUMPY = """
import numpy as np


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def fit(X, y, lr=0.1, steps=200):
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd[sd == 0] = 1.0
    X = (X - mu) / sd
    w = np.zeros(X.shape[1])
    losses = []
    for _ in range(steps):
        p = np.clip(sigmoid(X @ w), 1e-12, 1 - 1e-12)
        loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
        grad = X.T @ (p - y) / len(y)
        w -= lr * grad
        losses.append(loss)
    rmse = np.sqrt(np.mean((X @ w - y) ** 2))
    return w, losses, rmse
"""


@pytest.mark.parametrize("src", [HEALTHY_TORCH, HEALTHY_NUMPY], ids=["torch", "numpy"])
def test_healthy_training_scripts_are_clean(src: str) -> None:
    assert [f.format() for f in lint_source(src)] == []


RECALL = FIXTURES / "recall"


def test_the_shapes_of_public_nan_fixes_are_flagged_and_their_fixes_are_not() -> None:
    """Each file is the shape of a training-code change that fixed a NaN: the code before the fix
    is flagged at the hazard, the code after it is clean (the recall figure of
    docs/lint/precision.md)."""
    from nanscope.lint import lint_paths

    exp = {(p.name, line, code) for p in RECALL.glob("*.py") for line, code in expected(p)}
    got = {(Path(f.path).name, f.line, f.code) for f in lint_paths([RECALL]).findings}
    assert got - exp == set(), f"flagged but not expected: {sorted(got - exp)}"
    assert exp - got == set(), f"missed: {sorted(exp - got)}"
    assert len({name for name, _, _ in exp}) == len(list(RECALL.glob("*.py")))
