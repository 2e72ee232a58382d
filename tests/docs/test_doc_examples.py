"""The documentation's Python examples run as written, and print what their comments say.

Every ```python block of the README and the user pages under ``docs/`` runs in a fresh process
in an empty folder, unless the line before it says ``<!-- not run: why -->`` (an outline whose
names are the reader's own). A block that needs a framework that is not installed is skipped. A
``print(...)  # word`` line whose comment is one word (a cause, a number) must print that word,
and nothing may ask for a bug report (a replay that failed says "Please report this").
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every example in a fresh process

ROOT = Path(__file__).resolve().parents[2]
#: the rule, lint and log pages have their own checks (their fixtures and generated pages)
PAGES = [ROOT / "README.md", *sorted(
    p for p in (ROOT / "docs").rglob("*.md")
    if p.relative_to(ROOT / "docs").parts[0] not in ("lint", "logs", "rules")
)]  # fmt: skip
BLOCK = re.compile(r"^(?P<before>[^\n]*)\n(?P<indent>[ ]*)```python\n(?P<code>.*?)^(?P=indent)```",
                   re.M | re.S)  # fmt: skip
FRAMEWORKS = ("torch", "lightning", "transformers", "keras", "polars", "matplotlib")


def _examples() -> list[pytest.param]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for k, match in enumerate(BLOCK.finditer(text), 1):
            if "<!-- not run" in match.group("before"):
                continue
            indent = len(match.group("indent"))
            code = "\n".join(line[indent:] for line in match.group("code").splitlines())
            found.append(pytest.param(code, id=f"{page.relative_to(ROOT)}#{k}"))
    return found


EXAMPLES = _examples()


def test_the_pages_have_examples_that_run() -> None:
    ids = {p.id for p in EXAMPLES}
    assert {"README.md#1", "docs/torch.md#1", "docs/integrations/lightning.md#1"} <= ids


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs_as_written(code: str, tmp_path: Path) -> None:
    for name in FRAMEWORKS:
        if re.search(rf"^\s*(import|from) {name}\b", code, re.M) and not importlib.util.find_spec(
            name
        ):
            pytest.skip(f"needs {name}")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**_env(), "KERAS_BACKEND": "torch", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Please report" not in done.stderr, done.stderr[-3000:]
    for expected in re.findall(r"^\s*print\(.*\)\s+# (\S+)\s*$", code, re.M):
        assert expected in done.stdout, f"printed {done.stdout!r}, the comment says {expected}"


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_the_readme_links_work_on_a_package_index_page() -> None:
    """The README is the package's description: a relative link would break there, so every
    link is absolute and points at a file of this repository."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    base = "https://github.com/nanscope/nanscope/blob/main/"
    for link in links:
        assert link.startswith("https://"), link
        if link.startswith(base):
            assert (ROOT / link[len(base):].split("#")[0]).exists(), link
