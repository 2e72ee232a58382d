"""Every format has a docs page whose tiny example file reads as documented."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from nanscope.logs import FORMATS, load_trace, sniff

DOCS = Path(__file__).parents[2] / "docs" / "logs"
BLOCK = re.compile(r"```text name=(?P<name>\S+)\n(?P<body>.*?)```", re.S)
PAGES = {name: DOCS / f"{name}.md" for name in FORMATS}


def test_every_format_has_a_page_linked_from_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    for name, page in PAGES.items():
        assert page.exists(), name
        assert f"({page.name})" in index


def _example(tmp_path: Path, name: str) -> Path:
    match = BLOCK.search(PAGES[name].read_text())
    assert match is not None, f"{name}.md has no example file"
    path = tmp_path / match["name"]
    path.write_text(match["body"])
    return path


@pytest.mark.parametrize("name", [n for n in FORMATS if n != "tensorboard"])
def test_example_is_sniffed_as_its_format(tmp_path: Path, name: str) -> None:
    path = _example(tmp_path, name)
    assert sniff(path) == name
    trace = load_trace(path)
    assert len(trace) >= 2
    assert any(r.get("nf_loss") or r.get("nf_grads") or r.get("events") for r in trace)


def test_documented_results(tmp_path: Path) -> None:
    text = load_trace(_example(tmp_path, "text"))
    assert text.granularity == "epoch" and [r["step"] for r in text] == [84, 85]
    assert math.isnan(text[1]["val_loss"])
    csv = load_trace(_example(tmp_path, "csv"))
    assert csv[0] == {
        "step": 49,
        "epoch": 0,
        "loss": 0.412,
        "val_loss": 0.398,
        "extra": {"train_loss_epoch": 0.455},
    }
    jsonl = load_trace(_example(tmp_path, "jsonl"))
    assert [r["step"] for r in jsonl] == [10, 20, 30] and jsonl[1]["val_loss"] == 0.8
    state = load_trace(_example(tmp_path, "trainer_state"))
    assert state[1]["events"] == ["loss_nan_filtered"]
    assert [m["kind"] for m in state.meta["messages"]] == ["nan_filter"]
