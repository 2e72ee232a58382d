"""The seed's own epoch log (000): a late NaN after a long, steady run, diagnosed after the fact."""

from __future__ import annotations

from pathlib import Path

import nanscope
from nanscope.logs import load_trace

SEED_LOG = Path(__file__).resolve().parents[1] / "logs" / "fixtures" / "seed_000_epochs.txt"


def test_seed_000_epoch_log_is_a_late_spike_with_clipping_and_per_update_logging():
    trace = load_trace(SEED_LOG)
    diagnosis = nanscope.diagnose(trace)
    assert diagnosis.verdict == "nonfinite"
    assert diagnosis.granularity == "epoch"
    assert diagnosis.step == 85 and diagnosis.first_nonfinite == {"step": 85, "what": "loss"}
    assert diagnosis.cause == "extreme_batch"
    assert "jumped to nan at epoch 85" in diagnosis.evidence[0].text
    alternatives = {a["cause"] for a in diagnosis.alternatives}
    assert "exploding_gradients" in alternatives  # the answer the seed's helper gave
    actions = " ".join(diagnosis.actions)
    assert "Clip the gradient norm" in actions
    assert "per update" in actions
