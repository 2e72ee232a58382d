"""The training step cut out of the user's loop: what is kept, what is captured, what refuses."""

from __future__ import annotations

import textwrap
from pathlib import Path

from nanscope.probes.loopslice import plan_for


def _plan(tmp_path: Path, source: str, function: str = "<module>"):  # type: ignore[no-untyped-def]
    path = tmp_path / "train.py"
    text = textwrap.dedent(source)
    path.write_text(text)
    line = next(i + 1 for i, t in enumerate(text.splitlines()) if "# STEP" in t)
    plan = plan_for(str(path), function, line)
    lines = text.splitlines()
    kept = [lines[n - 1].strip() for n in plan.lines]
    return plan, kept


def test_a_dataloader_loop_keeps_the_step_and_drops_the_reporting(tmp_path: Path) -> None:
    plan, kept = _plan(tmp_path, """
        for epoch in range(3):
            total = 0.0
            for xb, yb in loader:
                opt.zero_grad()
                out = model(xb)
                loss = crit(out, yb)
                acc = (out.argmax(1) == yb).float().mean()
                loss.backward()
                opt.step()  # STEP
                total += loss.item()
                print(epoch, loss.item())
            scheduler.step()
    """)
    assert plan.ok and plan.unit == "loop"
    assert plan.captured == ("xb", "yb")
    assert plan.optimizer == "opt" and not plan.clips
    assert kept == ["opt.zero_grad()", "out = model(xb)", "loss = crit(out, yb)",
                    "loss.backward()", "opt.step()  # STEP"]  # fmt: skip


def test_a_drawn_batch_is_captured_and_not_drawn_again(tmp_path: Path) -> None:
    plan, kept = _plan(tmp_path, """
        for it in range(100):
            xb, yb = get_batch("train")
            logits, loss = model(xb, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()  # STEP
    """)
    assert plan.ok
    assert set(plan.captured) == {"it", "xb", "yb"}
    assert plan.skipped == [3]
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)" in kept
    assert not any("get_batch" in k for k in kept)
    # it clips itself: the replay's own clipping would test nothing more
    assert plan.clips


def test_a_function_is_the_unit_when_no_loop_holds_the_step(tmp_path: Path) -> None:
    plan, kept = _plan(tmp_path, """
        def train_step(model, opt, x, y):
            x = x.float()
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()  # STEP
            return loss.item()
    """, function="train_step")
    assert plan.ok and plan.unit == "function"
    assert plan.captured == ("model", "opt", "x", "y")
    # the kept x already went through its rebinding: it is not applied twice
    assert "x = x.float()" not in kept and plan.skipped == [3]


def test_a_step_under_a_condition_in_the_loop_spans_several_iterations(tmp_path: Path) -> None:
    plan, kept = _plan(tmp_path, """
        for i, (xb, yb) in enumerate(loader):
            loss = crit(model(xb), yb) / 4
            loss.backward()
            if (i + 1) % 4 == 0:
                opt.step()  # STEP
                opt.zero_grad()
            running += loss.item()
    """)
    assert plan.ok and plan.accumulates
    assert set(plan.captured) == {"i", "xb", "yb"}
    assert kept == ["loss = crit(model(xb), yb) / 4", "loss.backward()",
                    "if (i + 1) % 4 == 0:", "opt.step()  # STEP"]  # fmt: skip


def test_an_unreadable_source_says_why(tmp_path: Path) -> None:
    plan = plan_for(str(tmp_path / "missing.py"), "<module>", 3)
    assert not plan.ok and "cannot be read" in (plan.reason or "")


def _plan_by_hand(tmp_path: Path, source: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "train.py"
    text = textwrap.dedent(source)
    path.write_text(text)
    line = next(i + 1 for i, t in enumerate(text.splitlines()) if "backward()" in t)
    plan = plan_for(str(path), "<module>", line, by_hand=True)
    lines = text.splitlines()
    return plan, [lines[n - 1].strip() for n in plan.lines]


def test_a_loop_that_updates_by_hand_keeps_its_update_after_the_backward(tmp_path: Path) -> None:
    plan, kept = _plan_by_hand(tmp_path, """
        for epoch in range(3):
            perm = torch.randperm(n)
            for start in range(0, n, 32):
                idx = perm[start:start + 32]
                xb, yb = X[idx], y[idx]
                loss = ((xb @ w + b - yb) ** 2).mean()
                loss.backward()
                with torch.no_grad():
                    for p in params:
                        p -= lr * p.grad
                        p.grad.zero_()
                losses.append(loss.item())
                total += loss.item()
            print(epoch, losses[-1])
    """)
    assert plan.ok and plan.by_hand and plan.optimizer is None
    assert plan.captured == ("start",)
    assert kept == ["idx = perm[start:start + 32]", "xb, yb = X[idx], y[idx]",
                    "loss = ((xb @ w + b - yb) ** 2).mean()", "loss.backward()",
                    "with torch.no_grad():", "for p in params:", "p -= lr * p.grad",
                    "p.grad.zero_()"]  # fmt: skip
    assert {"perm", "X", "y", "w", "b", "params", "lr"} <= set(plan.free)


def test_an_update_through_data_needs_no_no_grad_block(tmp_path: Path) -> None:
    plan, kept = _plan_by_hand(tmp_path, """
        for xb, yb in batches:
            loss = crit(xb @ w, yb)
            loss.backward()
            w.data.add_(w.grad, alpha=-lr)
            running = running + 1
            w.grad.data.zero_()
    """)
    assert plan.ok
    assert kept == ["loss = crit(xb @ w, yb)", "loss.backward()",
                    "w.data.add_(w.grad, alpha=-lr)", "w.grad.data.zero_()"]  # fmt: skip


def test_a_backward_with_no_update_after_it_is_no_hand_written_step(tmp_path: Path) -> None:
    plan, _ = _plan_by_hand(tmp_path, """
        for xb, yb in batches:
            loss = crit(model(xb), yb)
            loss.backward()
            print(loss.item())
    """)
    assert not plan.ok and "in-place update" in (plan.reason or "")
