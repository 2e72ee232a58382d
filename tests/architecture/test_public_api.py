"""The public API is small and pinned."""

from __future__ import annotations

import nanscope


def test_public_names_are_pinned():
    assert sorted(nanscope.__all__) == sorted(
        [
            "CAUSES", "Diagnosis", "DivergenceError", "InputError", "MissingExtraError",
            "Monitor", "NanscopeError", "Trace", "TraceError", "UsageError", "__version__",
            "diagnose", "read_trace", "scan", "sweep", "watch",
        ]
    )  # fmt: skip


def test_dir_lists_the_public_names_and_the_lazy_ones_only():
    # what tab completion shows: no helper the module imports (Any, annotations), watch included
    assert dir(nanscope) == sorted(nanscope.__all__)
    assert {"watch", "scan", "sweep"} <= set(dir(nanscope))


def test_cause_vocabulary_is_the_contract():
    assert nanscope.CAUSES == (
        "step_size_too_large", "nonfinite_input", "update_sign_error", "extreme_batch",
        "log_of_zero", "zero_division", "fp16_overflow", "exploding_gradients",
        "bad_initialization", "healthy", "unknown",
    )  # fmt: skip


def test_error_tree():
    assert issubclass(nanscope.DivergenceError, FloatingPointError)
    assert issubclass(nanscope.DivergenceError, nanscope.NanscopeError)
    assert issubclass(nanscope.UsageError, ValueError)
    assert issubclass(nanscope.TraceError, nanscope.InputError)
    assert issubclass(nanscope.MissingExtraError, ModuleNotFoundError)
    assert issubclass(nanscope.MissingExtraError, nanscope.NanscopeError)


def test_integrations_surface_is_pinned_and_framework_free():
    import nanscope.integrations as integrations

    assert integrations.__all__ == ["KerasCallback", "LightningCallback", "TransformersCallback"]
