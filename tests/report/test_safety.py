"""Every string from a log, a trace, a script, a data file or a diagnosis is escaped."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

from nanscope.cli import main as nanscope_main
from nanscope.report.html import diagnosis_fragment, render_report
from nanscope.trace import TraceWriter

XSS = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(2)">'


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def _assert_inert(page: str) -> None:
    parser = _Tags()
    parser.feed(page)
    names = {tag for tag, _ in parser.tags}
    assert not names & {"script", "iframe", "object", "embed", "link", "base", "form", "svg"}
    for tag, attrs in parser.tags:
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name)
            if name in ("src", "href", "action"):
                assert (value or "").startswith("data:image/"), (tag, name, value)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text, not dropped
    # the plots are images (an <img> never runs script), and hold none anyway
    for data in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page):
        assert b"<script" not in base64.b64decode(data).lower()


def test_text_log_message_is_escaped(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "step 1 loss 1.0\nstep 2 loss 0.9\n"
        f"CUDA out of memory {XSS}\nstep 3 loss nan\n"
    )
    out = tmp_path / "r.html"
    assert nanscope_main(["report", str(log), "-o", str(out), "--no-plots"]) == 0
    page = out.read_text()
    _assert_inert(page)
    assert 'id="messages"' in page


def test_hostile_run_dir_is_escaped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    writer = TraceWriter(run / "trace.jsonl", {"name": XSS, "format": IMG, "messages": [
        {"line": 1, "kind": XSS, "text": XSS}]})  # fmt: skip
    for step in range(1, 9):
        record = {"step": step, "loss": 2.0**step, "lr": 0.1, "grad_norm": 1.0 * step,
                  "grad_norms": {XSS: 1.0 * step, IMG: 0.5}, "weight_norm": 1.0,
                  "update_norm": 0.1}  # fmt: skip
        if step == 4:
            record["events"] = [f"rollback {XSS}"]
            record["extra"] = {"rollback": {"why": IMG}}
        if step == 8:
            record["loss"] = float("nan")
        writer.write(record)
    writer.close()
    source = tmp_path / "train.py"
    source.write_text(f"x = 1\ny = '{XSS}'\nz = 3\n")
    diagnosis = {
        "schema": "nanscope.diagnosis/1", "verdict": XSS, "cause": XSS, "confidence": 0.5,
        "step": 8, "granularity": "update",
        "first_nonfinite": {"step": 8, "what": XSS},
        "evidence": [{"rule": XSS, "text": XSS, "data": {XSS: IMG}}],
        "actions": [XSS, IMG],
        "alternatives": [{"cause": XSS, "confidence": 0.1}],
        "contributing": [{"rule": XSS, "text": IMG, "data": {}}],
        "located": {"phase": XSS, "op": XSS, "module": IMG,
                    "source": {"file": str(source), "line": 2}},
        "rows": [{"batch_row": 1, "column": XSS, "value": IMG, "why": XSS, XSS: 1}],
        "run": {"id": XSS, "dir": IMG},
        "messages": [{"line": 3, "kind": "oom", "text": XSS}],
        "scan": {"source": XSS, "findings": [{"code": XSS, "column": IMG, "message": XSS,
                                              "fix": IMG, "rows": [XSS]}]},
        "experiment": {"text": XSS, "results": [{"factor": 1.0, "lr": 1.0, "outcome": XSS,
                                                 "final_loss": IMG}]},
        "lint": [{"code": XSS, "path": IMG, "line": 2, "message": XSS, "fix": IMG}],
    }  # fmt: skip
    (run / "diagnosis.json").write_text(json.dumps(diagnosis))
    assert nanscope_main(["report", str(run), "--title", XSS]) == 0
    page = (run / "report.html").read_text()
    _assert_inert(page)
    for section in ("evidence", "actions", "plots", "located", "rows", "lint", "scan", "sweep",
                    "rollbacks", "messages"):  # fmt: skip
        assert f'id="{section}"' in page, section
    # the verdict class is never built from a hostile string
    assert 'class="verdict verdict-unknown"' in page
    # the source line that holds the payload is shown escaped
    assert "y = &#x27;&lt;script&gt;" in page


def test_fragment_is_escaped() -> None:
    fragment = diagnosis_fragment({"verdict": XSS, "cause": XSS, "step": 3,
                                   "evidence": [{"text": XSS}], "actions": [IMG],
                                   "located": {"module": XSS}})  # fmt: skip
    assert "<script" not in fragment.lower() and "<img" not in fragment.lower()
    assert "&lt;script&gt;" in fragment


def test_title_is_escaped() -> None:
    page = render_report(None, {"verdict": "healthy", "cause": "healthy"}, title=XSS)
    assert "<title>&lt;script&gt;" in page and "<script" not in page.lower()
