"""Thin, process-wide patches shared by every Watcher, and the guard that keeps faults contained.

Patched once, on first use, and dispatched to the live watchers (a weak set):

* ``torch.Tensor.backward`` and ``torch.autograd.backward``: the tensor backward is called on is the
  loss (a re-entrancy flag keeps ``Tensor.backward -> autograd.backward`` from counting twice);
* ``torch.nn.modules.loss._Loss.__call__``: what a loss module receives (output, target);
* ``torch.nn.utils.clip_grad_norm_`` (and ``clip_grads_with_norm_``, which accelerate uses): the
  total norm is the *pre-clip* gradient norm;
* ``torch.amp.GradScaler.scale`` / ``.step``: which backward tensor is scaled, and the steps the
  scaler skips (the optimizer's own hooks never see those);
* ``torch.nn.Module.__reduce_ex__``: a copy of a watched module (``pickle``, ``torch.save(model)``,
  ``copy.deepcopy``, ``copy.copy``) leaves nanscope's hooks behind, so it pickles as it does
  bare, loads with ``weights_only=True``, and a deep copy (an EMA, ``AveragedModel``) is an
  unwatched model;
* ``torch.jit.script``, ``torch.jit.trace``, ``torch.jit.trace_module``, ``torch.export.export``:
  run with nanscope standing aside (:func:`standing_aside`: its hooks off torch's tables and the
  watched models) and every other hook quiet (:func:`transforming`);
* ``torch.nn.modules.module._has_any_global_hook`` (what ``torch.compile(module)`` warns about
  on every call: hooks that fire once more for its wrapper) leaves nanscope's own global module
  hooks out: they count the nesting, so the wrapper's call is no extra one for them.

Every hook passes through while the framework transforms, traces or recomputes (:func:`aside`):
inside ``torch.func`` transforms, a jit trace, and an activation checkpoint's recomputation it
saves no tensor, adds no graph node and raises nothing; the updates around them are watched.

Each patch calls the original first or last and does nothing else when no watcher is live. A fault
inside nanscope's part of a patch is caught by :class:`Guard` (the one fault guard,
:mod:`nanscope._guard`): one warning, that hook off, training goes on.
:class:`nanscope.DivergenceError` is the only exception allowed through: it is how a watcher stops
the step.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
from nanscope._frames import is_nanscope, is_user_file
from nanscope._guard import REPORT, FaultGuard
from nanscope.errors import DivergenceError
from nanscope.probes.failure import CallSite

__all__ = ["GUARD", "REPORT", "CallerSites", "Guard", "Listener", "aside", "compiling",
           "install", "live_watchers", "standing_aside", "transforming", "user_site"]  # fmt: skip


class Listener(Protocol):
    """What the patches call on each live listener (:func:`register`): a
    :class:`~nanscope.torch.watcher.Watcher`, or ``nanscope run``'s stand-ins that watch before
    there is one (:mod:`nanscope.torch.autowatch`)."""

    def owns(self, optimizer: Any) -> bool:
        """This listener watches ``optimizer`` (the GradScaler's step is reported to it)."""
        ...

    def on_backward(self, tensor: torch.Tensor, site: CallSite | None) -> None:
        """``backward()`` is about to run on the one-element ``tensor``, called at ``site``."""
        ...

    def on_loss_module(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A loss module (``nn.MSELoss``...) was called with these arguments."""
        ...

    def on_clip(self, total: Any) -> None:
        """``clip_grad_norm_`` returned the pre-clip ``total`` norm."""
        ...

    def scaler_step_begin(self, scaler: Any) -> None:
        """A GradScaler's ``step`` of an optimizer this listener owns begins."""
        ...

    def scaler_step_end(self, scaler: Any) -> None:
        """... and ended (it may have skipped the step)."""
        ...


class Guard(FaultGuard):
    """The fault guard of hook code (:class:`nanscope._guard.FaultGuard`, parts called hooks)."""

    def __init__(self) -> None:
        super().__init__("hook")


#: the guard of the process-wide patches
GUARD = Guard()

_LISTENERS: weakref.WeakSet[Listener] = weakref.WeakSet()


def _never_compiling() -> bool:
    return False


#: True while ``torch.compile`` traces: hooks run inside the traced code then, and what they
#: do there is left out of the graph (frames, RNG reads and the watchers' state break it). It is
#: torch's own ``torch.compiler.is_compiling`` (the compiler folds that call to True while it
#: traces), not a wrapper of it: the hooks ask on every call.
compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", None
) or _never_compiling

_functorch: Any = getattr(torch._C, "_functorch", None)
_transform_level: Callable[[], Any] = getattr(_functorch, "peek_interpreter_stack", None) or (
    lambda: None
)
_jit_tracing: Callable[[], bool] = getattr(torch._C, "_is_tracing", None) or _never_compiling
_graph_task: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", None) or (lambda: -1)
#: how many calls nanscope stands aside for now (:func:`standing_aside`)
_ASIDE = [0]


def transforming() -> bool:
    """True inside a ``torch.func`` transform (``vmap``, ``grad``, ``jvp``...), a jit trace, or a
    call nanscope stands aside for: the tensors there are the transform's (batched, traced), not
    the update's, and reading one (``.item()``, ``bool``) is an error."""
    return bool(_ASIDE[0]) or _transform_level() is not None or _jit_tracing()


def aside() -> bool:
    """:func:`transforming`, or a forward run while a backward runs: an activation checkpoint
    recomputing its segment (reentrant or not), which must save the tensors the first forward
    saved, no more. The hooks of the model, the loss and the backward pass through then."""
    return bool(_ASIDE[0]) or _transform_level() is not None or _jit_tracing() or (
        _graph_task() != -1
    )


#: the hook tables of a module: hooks keyed by handle id, and the flags kept per id
_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
_FLAG_TABLES = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                "_forward_hooks_always_called")  # fmt: skip


def _without_ours(state: Any) -> Any:
    """A module's pickled state with nanscope's hooks (and their flags) left out; the same object
    when it holds none."""
    if not isinstance(state, dict):
        return state
    ids = {key for name in _HOOK_TABLES for key, hook in (state.get(name) or {}).items()
           if _ours(hook)}  # fmt: skip
    if not ids:
        return state
    state = dict(state)
    for name in (*_HOOK_TABLES, *_FLAG_TABLES):
        table = state.get(name)
        if table and not ids.isdisjoint(table):
            kept = table.copy()
            for key in ids.intersection(table):
                del kept[key]
            state[name] = kept
    return state


@contextlib.contextmanager
def _quiet() -> Any:
    """Every hook passes through (:func:`transforming` is true) while torch runs a tracer."""
    _ASIDE[0] += 1
    try:
        yield
    finally:
        _ASIDE[0] -= 1


#: the live watchers as a tuple of weak references, what the patches read on every call (a
#: ``WeakSet``'s ``len`` and iteration are Python calls; a tuple's are not). Remade on register,
#: unregister and when a watcher is collected.
_LISTENERS_NOW: tuple[weakref.ref[Listener], ...] = ()
_LOCK = threading.Lock()
_INSTALLED = False
_STATE = threading.local()
_SCALED: weakref.WeakKeyDictionary[torch.Tensor, Any] = weakref.WeakKeyDictionary()
#: a GradScaler scaled a loss in this process: until then no backward needs :func:`scaled_by`
#: (the mapping's own ``len`` is a Python call, on every backward)
scaling = False

_SITE_CACHE: dict[tuple[int, int], CallSite | None] = {}


#: the user's line of the last loss-module call (read by the watcher's window at that call)
LOSS_SITE: dict[str, CallSite | None] = {"site": None}


class CallerSites:
    """The user's line that called a hook (the first frame outside torch, nanscope and the
    trainers; ``None`` when a nanscope function named ``skip_from`` is on the way: a late call).
    The hook is called the same way every update, so the walk's first and last code objects
    (the hook's caller and the user's function) and its length are kept: while the frames at
    both ends have the same code, the user's line is read without walking the frames between
    (library frames: the same count of them ends at the same user function only on the same
    path) or looking at a file name again."""

    def __init__(self) -> None:
        self._codes: list[Any] = []
        self._sites: dict[int, CallSite] = {}

    def get(self, depth: int = 2, limit: int = 12, skip_from: str = "") -> CallSite | None:
        try:
            f: Any = sys._getframe(depth)
        except ValueError:
            return None
        codes = self._codes
        if codes and f.f_code is codes[0]:
            try:
                user: Any = sys._getframe(depth + len(codes) - 1)
            except ValueError:
                user = None
            if user is not None and user.f_code is codes[-1]:
                line = user.f_lineno
                site = self._sites.get(line)
                if site is None:
                    if len(self._sites) > 64:
                        self._sites.clear()
                    site = CallSite(user.f_code.co_filename, line, user.f_code.co_name)
                    self._sites[line] = site
                return site
        walked: list[Any] = []
        while f is not None and limit > 0:
            code = f.f_code
            filename = code.co_filename
            walked.append(code)
            if skip_from and code.co_name == skip_from and is_nanscope(filename):
                return None
            if is_user_file(filename):
                self._codes, self._sites = walked, {}
                return CallSite(filename, f.f_lineno, code.co_name)
            f = f.f_back
            limit -= 1
        return None


def _ours(hook: Any) -> bool:
    """A hook nanscope registered (a function or bound method of a nanscope module)."""
    fn = getattr(hook, "__func__", hook)
    fn = getattr(fn, "func", fn)  # functools.partial
    return str(getattr(fn, "__module__", "") or "").startswith("nanscope.")


@contextlib.contextmanager
def standing_aside() -> Any:
    """While nanscope replays a window itself: none of its hooks and patches see anything.

    nanscope's entries are taken out of torch's global forward and optimizer hook tables and out
    of the live watchers' models and optimizers (the user's own hooks stay: a weight
    parametrisation is part of the model), the patches see no live watcher, and everything is put
    back as it was. Nothing is paid on the hot path for this: it happens only around a replay."""
    global _LISTENERS_NOW
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optim_mod

    tables: list[dict[Any, Any]] = []
    for name in ("_global_forward_pre_hooks", "_global_forward_hooks"):
        table = getattr(module_mod, name, None)
        if isinstance(table, dict):
            tables.append(table)
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        table = getattr(optim_mod, name, None)
        if isinstance(table, dict):
            tables.append(table)
    for watcher in _live():
        for owner in (getattr(watcher, "model", None), getattr(watcher, "optimizer", None)):
            for name in ("_forward_pre_hooks", "_forward_hooks", "_optimizer_step_pre_hooks",
                         "_optimizer_step_post_hooks"):  # fmt: skip
                table = getattr(owner, name, None) if owner is not None else None
                if isinstance(table, dict):
                    tables.append(table)
    removed: list[tuple[dict[Any, Any], list[tuple[Any, Any]], list[Any]]] = []
    for table in tables:
        order = list(table.keys())
        ours = [(key, hook) for key, hook in table.items() if _ours(hook)]
        if ours:
            for key, _ in ours:
                del table[key]
            removed.append((table, ours, order))
    live, _LISTENERS_NOW = _LISTENERS_NOW, ()
    try:
        yield
    finally:
        _LISTENERS_NOW = live
        for table, ours, order in removed:
            for key, hook in ours:
                table[key] = hook
            # in the order they were registered (an OrderedDict keeps insertion order)
            items = sorted(table.items(), key=lambda kv: order.index(kv[0])
                           if kv[0] in order else len(order))  # fmt: skip
            table.clear()
            table.update(items)


def live_watchers() -> list[Listener]:
    return list(_LISTENERS)


def _live() -> list[Listener]:
    """The live watchers, from the snapshot (the patches' fast path)."""
    out = []
    for ref in _LISTENERS_NOW:
        watcher = ref()
        if watcher is not None:
            out.append(watcher)
    return out


def _refresh(_gone: Any = None) -> None:
    global _LISTENERS_NOW
    _LISTENERS_NOW = tuple(weakref.ref(w, _refresh) for w in list(_LISTENERS))


def register(watcher: Listener) -> None:
    install()
    _LISTENERS.add(watcher)
    _refresh()


def unregister(watcher: Listener) -> None:
    _LISTENERS.discard(watcher)
    _refresh()


def user_site(depth: int = 2) -> CallSite | None:
    """The first frame outside torch, nanscope and the trainers: where the user's code called in."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    key = (id(frame.f_code), frame.f_lineno)
    if key in _SITE_CACHE:
        return _SITE_CACHE[key]
    found: CallSite | None = None
    f: Any = frame
    while f is not None:
        filename = f.f_code.co_filename
        if is_user_file(filename):
            found = CallSite(filename, f.f_lineno, f.f_code.co_name)
            break
        f = f.f_back
    if len(_SITE_CACHE) > 256:
        _SITE_CACHE.clear()
    _SITE_CACHE[key] = found
    return found


def scaled_by(tensor: torch.Tensor) -> Any:
    """The GradScaler whose ``scale()`` produced ``tensor``, if one did."""
    if not scaling:
        return None
    try:
        return _SCALED.get(tensor)
    except TypeError:
        return None


def _notify_backward(tensors: Any) -> None:
    """``backward()`` is about to run on ``tensors``: a one-element tensor is a loss, handed to
    every live watcher with the user's line. Under :data:`GUARD` (written out: it runs on every
    backward; the line is read 3 frames up: this one, the patch, the caller)."""
    if "backward" in GUARD.off or aside():
        return  # (a checkpoint's backward inside the backward, a tracer's: not the loss)
    try:
        if isinstance(tensors, torch.Tensor):
            tensor = tensors
        elif isinstance(tensors, (list, tuple)) and len(tensors) == 1:
            tensor = tensors[0]
        else:
            return
        if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
            return
        site = user_site(3)
        for ref in _LISTENERS_NOW:
            watcher = ref()
            if watcher is not None:
                watcher.on_backward(tensor, site)
    except DivergenceError:
        raise
    except Exception as exc:
        GUARD.fault("backward", exc, stacklevel=4)


def install() -> None:
    """Patch once per process (idempotent, thread-safe)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
        _patch_backward()
        _patch_loss()
        _patch_clip()
        _patch_scaler()
        _patch_copies()
        _patch_tracers()
        _patch_global_hook_check()


def _patch_backward() -> None:
    torch.Tensor.backward = _notifying(torch.Tensor.backward)  # type: ignore[method-assign]
    torch.autograd.backward = _notifying(torch.autograd.backward)


def _notifying(backward: Callable[..., Any]) -> Callable[..., Any]:
    """``backward`` (``Tensor.backward`` or ``torch.autograd.backward``) that first hands the
    hooks the tensors it starts from, once per outermost call (not a backward inside it)."""

    @functools.wraps(backward)
    def notifying(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if _LISTENERS_NOW and not getattr(_STATE, "inside", False):
            _notify_backward(tensors)
            _STATE.inside = True
            try:
                return backward(tensors, *args, **kwargs)
            finally:
                _STATE.inside = False
        return backward(tensors, *args, **kwargs)

    return notifying


def _patch_loss() -> None:
    from torch.nn.modules.loss import _Loss

    call = torch.nn.Module.__call__

    def loss_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _LISTENERS_NOW and "loss module" not in GUARD.off and not compiling() and not aside():
            try:
                LOSS_SITE["site"] = user_site(2)  # the user's line that called the loss module
                for ref in _LISTENERS_NOW:
                    watcher = ref()
                    if watcher is not None:
                        watcher.on_loss_module(self, args, kwargs)
            except DivergenceError:
                raise
            except Exception as exc:
                GUARD.fault("loss module", exc)
        return call(self, *args, **kwargs)

    _Loss.__call__ = loss_call  # type: ignore[method-assign]


#: the last ``clip_grad_norm_`` call: ``params`` (a list), ``max_norm``, ``norm_type``; empty when
#: its arguments could not be read
CLIP_CALL: dict[str, Any] = {}


def _clip_call(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args:
        params, rest = args[0], args[1:]
    else:
        params, rest = kwargs.get("parameters"), ()
    if isinstance(params, torch.Tensor):
        listed: Any = [params]
    elif isinstance(params, (list, tuple)):
        listed = params
    elif params is not None:
        listed = list(params)
        if args:
            args = (listed, *rest)
        else:
            kwargs = {**kwargs, "parameters": listed}
    else:
        return args, kwargs
    max_norm = rest[0] if rest else kwargs.get("max_norm")
    norm_type = rest[1] if len(rest) > 1 else kwargs.get("norm_type", 2.0)
    CLIP_CALL.update(params=listed, max_norm=max_norm, norm_type=norm_type)
    return args, kwargs


def _patch_clip() -> None:
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_mod

    original = nn_utils.clip_grad_norm_

    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        if not _LISTENERS_NOW:
            return original(*args, **kwargs)
        # the parameters it clips (an iterator is read into a list first, which torch accepts
        # the same): a watcher whose parameters are all among them may take the finite total as
        # its own finiteness check instead of measuring the gradients again
        CLIP_CALL.clear()
        try:
            args, kwargs = _clip_call(args, kwargs)
        except Exception:
            CLIP_CALL.clear()
        total = original(*args, **kwargs)
        for watcher in _live():
            GUARD.run("clip_grad_norm_", watcher.on_clip, total)
        return total

    nn_utils.clip_grad_norm_ = clip_grad_norm_
    if getattr(clip_mod, "clip_grad_norm_", None) is original:
        clip_mod.clip_grad_norm_ = clip_grad_norm_  # type: ignore[assignment]
    # accelerate (HF Trainer) computes get_total_norm itself, then clip_grads_with_norm_
    with_norm = getattr(nn_utils, "clip_grads_with_norm_", None)
    if with_norm is not None:

        @functools.wraps(with_norm)
        def clip_grads_with_norm_(parameters: Any, max_norm: Any, total_norm: Any,
                                  *args: Any, **kwargs: Any) -> Any:  # fmt: skip
            if _LISTENERS_NOW:
                CLIP_CALL.clear()  # (its total was computed elsewhere: not taken as a check)
                for watcher in _live():
                    GUARD.run("clip_grad_norm_", watcher.on_clip, total_norm)
            return with_norm(parameters, max_norm, total_norm, *args, **kwargs)

        nn_utils.clip_grads_with_norm_ = clip_grads_with_norm_
        if getattr(clip_mod, "clip_grads_with_norm_", None) is with_norm:
            setattr(clip_mod, "clip_grads_with_norm_", clip_grads_with_norm_)  # noqa: B010


#: called with the optimizer before each ``GradScaler.step``: a scaler that skips every step
#: (its scale collapsing in float16) never runs ``optimizer.step``, whose pre-hook is where
#: ``nanscope run`` makes an optimizer's watcher
SCALER_STEP: list[Any] = []


def _patch_scaler() -> None:
    scaler_cls = getattr(torch.amp, "GradScaler", None)
    if scaler_cls is None:  # pragma: no cover - very old torch
        return
    scale = scaler_cls.scale
    step = scaler_cls.step

    @functools.wraps(scale)
    def scale_(self: Any, outputs: Any) -> Any:
        global scaling
        out = scale(self, outputs)
        if _LISTENERS_NOW and isinstance(out, torch.Tensor) and out is not outputs:
            with contextlib.suppress(TypeError):
                _SCALED[out] = self
                scaling = True
        return out

    @functools.wraps(step)
    def step_(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if _LISTENERS_NOW:
            for hook in SCALER_STEP:  # (nanscope run: a watcher for an optimizer never stepped)
                GUARD.run("GradScaler.step", hook, optimizer)
        watchers = [w for w in _live() if w.owns(optimizer)] if _LISTENERS_NOW else []
        for watcher in watchers:
            watcher.scaler_step_begin(self)
        out = step(self, optimizer, *args, **kwargs)
        for watcher in watchers:
            GUARD.run("GradScaler.step", watcher.scaler_step_end, self)
        return out

    scaler_cls.scale = scale_
    scaler_cls.step = step_


def _patch_copies() -> None:
    module_cls = torch.nn.Module
    reduce_ex = module_cls.__reduce_ex__

    @functools.wraps(reduce_ex)
    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        rv = reduce_ex(self, protocol)
        if isinstance(rv, tuple) and len(rv) > 2:
            state = _without_ours(rv[2])
            if state is not rv[2]:
                rv = (*rv[:2], state, *rv[3:])
        return rv

    module_cls.__reduce_ex__ = __reduce_ex__  # type: ignore[assignment,method-assign]


def _patch_tracers() -> None:
    """torch's tracers and compilers that read a module's hooks, or run them on stand-in tensors
    (see the module doc); the call is torch's, unchanged, with nanscope standing aside."""
    export = getattr(torch, "export", None)
    for owner, name in ((torch.jit, "script"), (torch.jit, "trace"), (torch.jit, "trace_module"),
                        (export, "export")):  # fmt: skip
        original = getattr(owner, name, None)
        if original is None:
            continue

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
                with standing_aside(), _quiet():
                    return original(obj, *args, **kwargs)

            return call

        setattr(owner, name, make(original))


def _patch_global_hook_check() -> None:
    from torch.nn.modules import module as module_mod

    check = getattr(module_mod, "_has_any_global_hook", None)
    if check is None:
        return
    # (the tables of flags by hook id are left out: a removed hook's id can stay in them)
    names = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
             "_global_forward_hooks")  # fmt: skip

    @functools.wraps(check)
    def _has_any_global_hook() -> bool:
        return any(not _ours(hook) for name in names
                   for hook in (getattr(module_mod, name, None) or {}).values())  # fmt: skip

    module_mod._has_any_global_hook = _has_any_global_hook
