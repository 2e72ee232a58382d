"""The integrations package itself imports no framework, and exports each callback lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nanscope.integrations import split_batch

FRAMEWORKS = ("torch", "lightning", "transformers", "keras", "tensorflow", "jax")


def test_importing_integrations_imports_no_framework():
    code = (
        "import sys, nanscope, nanscope.integrations\n"
        f"loaded = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_unknown_name_is_an_attribute_error():
    import nanscope.integrations as integrations

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = integrations.Nope


@pytest.mark.parametrize(
    ("batch", "expect"),
    [
        (None, (None, None)),
        ((1, 2, 3), (1, 2)),
        ([7], (7, None)),
        ({"input_ids": 1, "attention_mask": 0, "labels": 2}, (1, 2)),
        ({"x": 3}, (3, None)),
        ("tensor-like", ("tensor-like", None)),
    ],
)
def test_split_batch(batch, expect):
    assert split_batch(batch) == expect
