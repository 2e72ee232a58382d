"""The report of a real diverging fit, opened in headless Chromium: no console error, plots visible.

Two screenshots of the same layout: the page itself, and a copy whose plot images are painted
solid black (``filter: brightness(0)``, which keeps every box where it is). The black boxes say
where each plot is; the real screenshot must show a picture there, and the loss plot must show
the detection line at the update where nanscope stopped the fit.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.report.html import write_report
from nanscope.report.plots import VERDICT_COLORS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: the fit's learning rate is constant, so it gets a note, not a panel
#: (the sign-flip fraction, measured at one update of this short fit, is a note, not a panel)
KEYS = ["loss", "grad_norm", "update_ratio"]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _screenshot(browser: str, page: Path, png: Path, profile: Path) -> str:
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
        f"--screenshot={png}", "--window-size=1200,2400", "--enable-logging=stderr", "--v=0",
        page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert png.is_file(), f"no screenshot: rc {done.returncode}\n{done.stderr[-2000:]}"
    return done.stderr


def _diverging_fit(run_dir: Path) -> tuple[nanscope.Monitor, nanscope.Diagnosis]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    X[:, 2] *= 10  # one unscaled feature
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=200)
    w, lr = np.zeros(3), 0.5
    mon = nanscope.Monitor(run_dir=run_dir)
    with pytest.raises(nanscope.DivergenceError) as caught:
        for _ in range(200):
            batch = rng.integers(0, 200, 32)
            residual = X[batch] @ w - y[batch]
            grad = 2 * X[batch].T @ residual / len(batch)
            mon.update(float(np.mean(residual**2)), params={"w": w}, grads={"w": grad}, lr=lr,
                       inputs=X[batch], targets=y[batch])  # fmt: skip
            w = w - lr * grad
    diagnosis = caught.value.diagnosis
    assert diagnosis is not None
    return mon, diagnosis


def _boxes(black: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(top, bottom, left, right) of each solid black rectangle, top to bottom."""
    mask = (black < 8).all(axis=2)
    rows = mask.sum(axis=1) >= 400
    boxes = []
    y = 0
    while y < len(rows):
        if not rows[y]:
            y += 1
            continue
        top = y
        while y < len(rows) and rows[y]:
            y += 1
        cols = np.flatnonzero(mask[top:y].mean(axis=0) > 0.9)
        boxes.append((top, y, int(cols[0]), int(cols[-1]) + 1))
    return boxes


def test_report_of_a_real_fit_renders_in_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium found (install it: apt-get install -y chromium)")
    from PIL import Image

    mon, diagnosis = _diverging_fit(tmp_path / "run")
    page = write_report(mon.trace, diagnosis, tmp_path / "report.html")
    text = page.read_text()
    assert "https://" not in text and "http://" not in text

    masked = tmp_path / "masked.html"
    masked.write_text(text.replace("</head>", "<style>.plots img{filter:brightness(0)}</style>"
                                   "</head>", 1))  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(_screenshot, browser, p, tmp_path / f"{p.stem}.png",
                            tmp_path / f"profile-{p.stem}") for p in (page, masked)]  # fmt: skip
        logs = [job.result() for job in jobs]
    console = [line for line in logs[0].splitlines() if ":CONSOLE" in line]
    assert not console, console

    shot = np.asarray(Image.open(tmp_path / "report.png").convert("RGB")).astype(int)
    black = np.asarray(Image.open(tmp_path / "masked.png").convert("RGB")).astype(int)
    boxes = _boxes(black)
    order = re.findall(r'<figure class="plot" id="plot-(\w+)"', text)
    assert order == KEYS
    assert len(boxes) == len(KEYS), boxes
    for key, (top, bottom, left, right) in zip(KEYS, boxes):
        assert bottom - top > 100 and right - left > 600, (key, top, bottom, left, right)
        region = shot[top:bottom, left:right]
        colours = np.unique(region[..., 0] * 65536 + region[..., 1] * 256 + region[..., 2])
        not_white = (region.sum(axis=2) < 720).mean()
        assert len(colours) > 20 and not_white > 0.01, f"plot {key} looks blank"
        assert (shot[top:bottom, left:right] != black[top:bottom, left:right]).any()

    # the loss plot shows the detection line at the update where the fit was stopped
    tag = re.search(r'<figure class="plot" id="plot-loss"[^>]*data-plot="([^"]*)"', text)
    assert tag
    meta = json.loads(html.unescape(tag.group(1)))
    assert meta["detect_step"] == diagnosis.step
    top, bottom, left, right = boxes[0]
    (x0, x1), (a_left, a_bottom, a_right, a_top) = meta["xlim"], meta["axes"]
    frac = a_left + (diagnosis.step - x0) / (x1 - x0) * (a_right - a_left)
    column = left + round(frac * (right - left))
    colour = np.array([int(VERDICT_COLORS["diverging"][i : i + 2], 16) for i in (1, 3, 5)])
    band = shot[top:bottom, column - 2 : column + 3]
    hits = (np.abs(band - colour).sum(axis=2) < 90).any(axis=1).sum()
    axes_height = (a_top - a_bottom) * (bottom - top)
    assert hits > 0.3 * axes_height, f"no detection line at update {diagnosis.step}"
    elsewhere = shot[top:bottom, left + round(a_left * (right - left)) + 5]
    assert (np.abs(elsewhere - colour).sum(axis=1) < 90).sum() < 0.1 * axes_height
    keep = os.environ.get("NANSCOPE_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(tmp_path / "report.png", keep)
