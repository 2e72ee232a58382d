from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def healthy() -> dict[str, np.ndarray]:
    """Standardised-looking features and a 0/1 target: every check must stay quiet."""
    rng = np.random.default_rng(0)
    n = 2000
    return {
        "a": rng.normal(0.0, 1.0, n),
        "b": rng.normal(3.0, 2.0, n),
        "c": rng.uniform(-1.0, 1.0, n),
        "d": rng.integers(0, 10, n).astype(np.int64),
        "y": (rng.random(n) < 0.3).astype(np.int64),
    }
