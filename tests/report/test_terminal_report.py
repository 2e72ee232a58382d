"""The terminal report renders to a string with the verdict, evidence, sparkline and actions."""

from __future__ import annotations

import math

import numpy as np

import nanscope
from nanscope.report.terminal import render, sparkline


def test_sparkline_marks_nonfinite_updates():
    line = sparkline([1.0, 2.0, 4.0, 8.0, math.inf, math.nan])
    assert line.endswith("××") and line[0] == "▁" and line[3] == "█"


def test_report_has_verdict_cause_evidence_and_actions():
    mon = nanscope.Monitor(write=False)
    loss = 1.0
    try:
        for i in range(40):
            w = np.array([(-3.0) ** i, 1.0])
            mon.update(loss, params={"w": w}, grads={"w": w})
            loss *= 9.0
    except nanscope.DivergenceError as stop:
        diagnosis = stop.diagnosis
    text = render(diagnosis, mon.trace)
    assert "diverging: step_size_too_large" in text
    assert "evidence:" in text and "[D001]" in text
    assert "what to do:" in text and "1. Cut the learning rate tenfold" in text
    colored = render(diagnosis, mon.trace, color=True)
    assert "step_size_too_large" in colored
