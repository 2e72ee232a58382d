"""The user's lines a watcher keeps for each update: where the model, the loss module and
``backward()`` were called. The hooks read them from cached frame walks, so the tests move the
calls between lines, functions of the user's and torch's own frames, and check that each update
names its own lines."""

from __future__ import annotations

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import nanscope  # noqa: E402


def _line_of(marker: str) -> int:
    """The line of this file that carries ``marker`` in a comment."""
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    hits = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def _helper_forward(model, x):
    return model(x)  # HELPER-MODEL


def test_each_update_names_its_own_model_loss_and_backward_lines(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        watcher = nanscope.watch(model, opt, run_dir=tmp_path)
        for step in range(12):
            opt.zero_grad()
            if step % 4 == 1:  # through a function of the user's, and other calls
                out = _helper_forward(model, x)
                loss = nn.functional.mse_loss(out, y) + 0.0 * loss_fn(out, y)  # OTHER-LOSS
                torch.autograd.backward(loss)  # OTHER-BACKWARD
                want = ("HELPER-MODEL", "OTHER-LOSS", "OTHER-BACKWARD")
            elif step % 4 == 3:  # through torch's own frames: the user's line is below them
                params = dict(model.named_parameters())
                out = torch.func.functional_call(model, params, (x,))  # LIBRARY-MODEL
                loss = loss_fn(out, y)  # LOSS
                loss.backward()  # BACKWARD
                want = ("LIBRARY-MODEL", "LOSS", "BACKWARD")
            else:
                out = model(x)  # MODEL
                loss = loss_fn(out, y)  # LOSS-2
                loss.backward()  # BACKWARD-2
                want = ("MODEL", "LOSS-2", "BACKWARD-2")
            window = watcher.window
            seen.append(((window.model_site.line, window.loss_site.line, window.site.line),
                         tuple(_line_of(m) for m in want)))  # fmt: skip
            assert window.model_site.file == __file__
            opt.step()
        watcher.close()
    assert [got for got, _ in seen] == [want for _, want in seen]
