"""``bench/scenarios.py``, the instrument that measures nanscope on a distribution of fits: the
scripts render and run, every label rests on the bare counterfactual runs (never on the fault
the generator meant to inject), and the command keeps its contract. nanscope's accuracy is not
asserted here: that is what the bench measures."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
NAN = math.nan

#: the intervention that must have trained for each label (any one of them)
PROOF = {
    "nonfinite_input": {"without_nonfinite_rows"},
    "extreme_batch": {"without_extreme_rows"},
    "fp16_overflow": {"float32"},
    "update_sign_error": {"sign_fixed"},
    "log_of_zero": {"eps_log"},
    "zero_division": {"eps_div", "adam_eps"},
    "bad_initialization": {"standard_init"},
    "exploding_gradients": {"clipped"},
    "step_size_too_large": {"lr_x0.1", "lr_x0.01", "lr_x0.001", "standardised"},
}


@pytest.fixture(scope="module")
def gen() -> Any:
    sys.path.insert(0, str(BENCH))
    import _scenario_gen

    return _scenario_gen


@pytest.fixture(scope="module")
def label(gen: Any) -> Any:
    import _scenario_label

    return _scenario_label


#: keyword names for the lr cuts (``lr_x0.1`` is not an identifier)
_CUTS = {"lr_1": "lr_x0.1", "lr_01": "lr_x0.01", "lr_001": "lr_x0.001"}


def _runs(**outcomes: str) -> dict[str, dict[str, str]]:
    return {_CUTS.get(name, name): {"outcome": outcome} for name, outcome in outcomes.items()}


# --- the judge ------------------------------------------------------------------------------


def test_a_run_fails_on_a_non_finite_loss_or_an_end_orders_of_magnitude_above_its_start(label):
    assert label.judge([1.0, 0.9, NAN, NAN])["outcome"] == "failed"
    assert label.judge([1.0, 0.9, math.inf])["first_nonfinite"] == 3
    assert label.judge([1.0, 2.0, 5.0, 20.0, 60.0, 90.0])["outcome"] == "failed"
    # one jump that never came back below the start, whatever it did after
    jumped = [1.0, 0.9, 40.0] + [1.5] * 20
    assert label.judge(jumped)["outcome"] == "failed"


def test_a_run_trained_when_it_ends_below_its_start_with_no_spike(label):
    descending = [1.0 / (1 + 0.1 * i) for i in range(40)]
    assert label.judge(descending)["outcome"] == "trained"
    # a spike that came back down, a flat loss, a slow climb: neither trained nor failed
    spiked = [1.0, 0.9, 30.0] + [0.5] * 30
    assert label.judge(spiked)["outcome"] == "unclear"
    assert label.judge([1.0] * 30)["outcome"] == "unclear"
    assert label.judge([1.0 + 0.05 * i for i in range(30)])["outcome"] == "unclear"
    assert label.judge([])["outcome"] == "unclear"


def test_a_fit_that_ends_above_its_first_loss_did_not_train_whatever_its_first_tenth(label):
    # a jump at update 2 inflates the median of the first tenth: ending below that median after
    # ending above the untrained loss is no training
    jumped = [1.0, 6.0, 5.0, 4.5, *[2.0] * 30]
    assert label.judge(jumped)["outcome"] == "unclear"
    assert label.judge([1.0, 6.0, 5.0, 4.5, *[0.5] * 30])["outcome"] == "trained"


def test_a_fit_that_converged_within_its_first_tenth_trained_when_it_held_that_level(label):
    # a fit at its noise floor after a few updates: its start (median of the first tenth) is
    # already the floor, so "end below the start" alone would call it unclear
    fast = [7.8, 0.9, *[0.68] * 80, *[0.72] * 18]
    judged = label.judge(fast)
    assert judged["outcome"] == "trained" and "first tenth" in judged["why"]
    assert label.judge([1.9, 1e-7, *[1.19e-7] * 40])["outcome"] == "trained"
    # it fell and then rose again well past where it fell to: not trained
    rising = [7.8, 0.7, 0.7, 0.7, *[0.7 + 0.05 * i for i in range(40)]]
    assert label.judge(rising)["outcome"] == "unclear"
    # it never fell to half its first loss: not trained
    assert label.judge([1.0, 0.8, *[0.8] * 40])["outcome"] == "unclear"


def test_a_fit_that_came_back_from_a_step_up_above_its_start_trained_and_says_where(label):
    descending = [2.0 / (1 + 0.1 * i) for i in range(60)]
    stepped = [*descending[:40], 5.0, *descending[40:]]
    judged = label.judge(stepped)
    assert judged["outcome"] == "trained" and judged["step_up"] == [41]
    decided = label.decide(None, judged, {})
    assert decided == {"label": "healthy", "step_up": [41], "rule": decided["rule"]}
    # the same typo met again each epoch: each step-up is one
    again = [*stepped[:50], 5.0, *stepped[50:]]
    assert label.judge(again)["step_up"] == [41, 51]
    # a batch-to-batch wobble that stays below where the fit started is no step-up
    wobbly = [*descending[:40], 1.5, *descending[40:]]
    assert "step_up" not in label.judge(wobbly)
    assert "step_up" not in label.judge(descending)


@pytest.mark.torch
def test_a_fit_whose_optimizer_never_stepped_did_not_train(label):
    pytest.importorskip("torch")
    never = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "w = torch.nn.Parameter(torch.ones(4))\n"
        "opt = torch.optim.SGD([w], lr=0.1)\n"
        "losses = []\n"
        "for i in range(30):\n"
        "    loss = ((w - 0.5) ** 2).sum() * (1 - i / 60)\n"  # falls by itself, weights untouched
        "    loss.backward()\n"
        "    if {step}:\n"
        "        opt.step()\n"
        "    opt.zero_grad()\n"
        "    losses.append(loss.item())\n"
    )
    stuck = label.run_script(never.format(step="(i + 1) % 64 == 0"))
    assert stuck["optimizer_steps"] == 0
    assert label.summarise_run(stuck)["outcome"] == "unclear"
    stepping = label.run_script(never.format(step="True"))
    assert stepping["optimizer_steps"] == 30
    assert label.summarise_run(stepping)["outcome"] == "trained"


def test_a_suspect_verdict_at_the_step_up_of_a_healthy_fit_is_right_and_a_stop_is_not(label):
    healthy = {"label": "healthy", "step_up": [20, 41]}
    suspect = {"verdict": "suspect", "cause": "extreme_batch", "step": 41}
    assert label.right_answer("extreme_batch", suspect, 0, healthy, accum=1)
    assert label.right_answer("healthy", {"verdict": "healthy"}, 0, healthy, accum=1)
    stopped = dict(suspect, verdict="nonfinite")
    assert not label.right_answer("extreme_batch", stopped, 3, healthy, accum=1)
    assert not label.right_answer("extreme_batch", dict(suspect, step=7), 0, healthy, accum=1)
    # the losses are per micro-batch: with 4 of them an update, micro-batch 41 is update 11
    assert label.right_answer("extreme_batch", dict(suspect, step=11), 0, healthy, accum=4)
    assert not label.right_answer("extreme_batch", suspect, 0, {"label": "healthy"}, accum=1)


# --- the decision ---------------------------------------------------------------------------


def _decide(label: Any, spec: Any, **outcomes: str) -> dict[str, Any]:
    return label.decide(spec, {"outcome": "failed", "why": "nan"}, _runs(**outcomes))


def test_a_nan_row_is_the_label_only_when_dropping_it_fixed_the_run(gen, label):
    spec = gen.Spec(seed=0, family="mlp", bad_rows=[(3, 1, "np.nan")])
    assert _decide(label, spec, without_nonfinite_rows="trained")["label"] == "nonfinite_input"
    kept = _decide(label, spec, without_nonfinite_rows="failed", lr_1="trained")
    assert kept["label"] == "step_size_too_large"
    nothing = _decide(label, spec, without_nonfinite_rows="failed", lr_1="failed", lr_01="failed")
    assert nothing["label"] is None and nothing["dropped"] == "no intervention removes the failure"


def test_an_extreme_row_that_a_smaller_step_also_survives_is_still_the_row(gen, label):
    spec = gen.Spec(seed=0, family="mlp", bad_rows=[(3, 1, "5e7")])
    decided = _decide(label, spec, without_extreme_rows="trained", lr_001="trained")
    assert decided["label"] == "extreme_batch"
    assert "also trained: lr_x0.001" in decided["rule"]


def test_two_fixes_that_name_different_causes_drop_the_scenario(gen, label):
    spec = gen.Spec(seed=0, family="cnn", loss="log_softmax_manual", init_std=2.0)
    decided = _decide(label, spec, eps_log="trained", standard_init="trained")
    assert decided["label"] is None and decided["dropped"].startswith("ambiguous")
    # two fixes that name one cause are not ambiguous
    spec = gen.Spec(seed=0, family="mlp", raw_columns=[(0, 5000.0, 1000.0, "income")])
    assert _decide(label, spec, standardised="trained", lr_001="trained")["label"] == (
        "step_size_too_large"
    )


def test_clipping_names_exploding_gradients_only_where_a_tenfold_cut_does_not_fix_it(gen, label):
    spec = gen.Spec(seed=0, family="rnn")
    assert _decide(label, spec, clipped="trained", lr_1="failed", lr_001="trained")["label"] == (
        "exploding_gradients"
    )
    assert _decide(label, spec, clipped="trained", lr_1="trained")["label"] == (
        "step_size_too_large"
    )


def test_a_bare_run_that_trained_is_healthy_and_one_that_neither_trained_nor_failed_is_dropped(
    gen, label
):
    spec = gen.Spec(seed=0, family="mlp")
    assert label.decide(spec, {"outcome": "trained", "why": ""}, {})["label"] == "healthy"
    unclear = label.decide(spec, {"outcome": "unclear", "why": "1.3x"}, {})
    assert unclear["label"] is None and unclear["dropped"] == "bare run neither trained nor failed"


# --- rendering ------------------------------------------------------------------------------


def test_every_scenario_renders_to_a_script_and_every_intervention_changes_it(gen):
    families = set()
    for seed in range(60):
        spec = gen.generate(seed)
        families.add(spec.family)
        text = gen.render(spec)
        compile(text, f"seed-{seed}", "exec")
        assert "losses.append(" in text and 'print(f"epoch ' in text
        if spec.family == "numpy":
            assert "nanscope.Monitor()" in text
            assert "nanscope" not in gen.render(spec, gen.Change(monitor=False))
        else:
            assert "nanscope" not in text
        for name, change in gen.applicable(spec).items():
            variant = gen.render(spec, change)
            compile(variant, f"seed-{seed}-{name}", "exec")
            assert variant != text, (seed, name)
    assert families == set(gen.FAMILIES)


def test_a_spec_survives_its_json_record(gen):
    for seed in range(12):
        spec = gen.generate(seed)
        again = gen.Spec.from_dict(json.loads(json.dumps(spec.to_dict())))
        assert gen.render(again) == gen.render(spec)


# --- labels from real bare runs -------------------------------------------------------------


@pytest.fixture(scope="module")
def warm(label: Any) -> Any:
    pytest.importorskip("torch")
    label.warm_up()
    return label


#: one scenario per cause the generator reaches often, the families mixed
REAL = [5, 7, 11, 16, 34, 65, 77, 156]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("seed", REAL)
def test_each_label_rests_on_the_intervention_that_trained(gen, warm, seed):
    record = warm.establish(gen.generate(seed))
    if record["label"] is None:
        assert record["dropped"] and record["rule"]
        return
    if record["label"] == "healthy":
        # only an excursion above the first loss is checked against a tenfold lr cut
        bare = record["bare"]
        checked = {"lr_x0.1"} if bare["peak"] >= warm.EXCURSION * bare["first"] else set()
        assert bare["outcome"] == "trained" and set(record["counterfactuals"]) == checked
        return
    assert record["bare"]["outcome"] == "failed"
    trained = {n for n, run in record["counterfactuals"].items() if run["outcome"] == "trained"}
    assert trained & PROOF[record["label"]], record
    assert set(record["counterfactuals"]) == set(gen.applicable(gen.generate(seed)))


@pytest.mark.slow
@pytest.mark.torch
def test_an_excursion_a_tenfold_lr_cut_beats_by_far_is_no_healthy_fit(gen, warm):
    # AdamW at lr 1 on the transformer: the loss leaves its range, stays out for a while and
    # comes back under the cosine decay to just below its first loss; lr/10 trains far lower
    spec = gen.generate(1371)
    assert spec.family == "transformer" and spec.schedule == "warmup_cosine"
    record = warm.establish(spec)
    bare, cut = record["bare"], record["counterfactuals"]["lr_x0.1"]
    assert bare["peak"] >= warm.EXCURSION * bare["first"] and bare["end"] < bare["first"]
    assert cut["outcome"] == "trained" and cut["end"] * warm.CUT_BETTER <= bare["end"]
    assert record["label"] is None and "tenfold smaller lr" in record["rule"]
    # the same excursion is healthy when the cut does no better: the label follows the cut
    kept = warm.establish(spec, runner=_sabotaged(warm, f"lr={spec.lr * 0.1:g},"))
    assert kept["counterfactuals"]["lr_x0.1"]["outcome"] == "failed"
    assert kept["label"] == "healthy"


def _sabotaged(label: Any, marker: str) -> Any:
    """A runner whose variants containing ``marker`` fail (NaN loss), as if that fix did not
    work: the label must follow."""

    def run(text: str) -> dict[str, Any]:
        if marker in text:
            return {"losses": [1.0, NAN], "error": None, "stdout": "", "seconds": 0.0}
        return label.run_script(text)

    return run


@pytest.mark.slow
@pytest.mark.torch
def test_a_nan_row_label_needs_the_run_without_the_row_to_train(gen, warm):
    spec = gen.generate(11)
    assert spec.injected == "nan_rows" and gen.rows_of(spec, "nonfinite")
    assert warm.establish(spec)["label"] == "nonfinite_input"
    record = warm.establish(spec, runner=_sabotaged(warm, "np.delete("))
    assert record["counterfactuals"]["without_nonfinite_rows"]["outcome"] == "failed"
    assert record["label"] != "nonfinite_input"


@pytest.mark.slow
@pytest.mark.torch
def test_a_sign_error_label_needs_the_fixed_sign_to_train(gen, warm):
    spec = gen.generate(34)
    assert spec.injected == "sign"
    assert warm.establish(spec)["label"] == "update_sign_error"
    record = warm.establish(spec, runner=_sabotaged(warm, "p -= lr * p.grad"))
    assert record["label"] != "update_sign_error"


# --- the command ----------------------------------------------------------------------------

LAST_LINE = re.compile(
    r"^scenarios: (\d+)/(\d+) right, healthy false alarms (\d+)/(\d+), crashes (\d+), "
    r"dropped (\d+)$"
)


@pytest.mark.slow
@pytest.mark.torch
def test_the_bench_keeps_its_contract_on_a_fixed_sample(tmp_path):
    pytest.importorskip("torch")
    sample = "0:4,11,34"  # every family, healthy fits and failures
    out = subprocess.run(
        [sys.executable, str(BENCH / "scenarios.py"), "--seeds", sample, "--jobs", "2",
         "--json", str(tmp_path / "out.json"), "--cache", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    right, labelled, alarms, healthy, crashes, dropped = (int(g) for g in match.groups())
    assert labelled + dropped == 6 and labelled >= 4 and 0 <= alarms <= healthy and healthy >= 1
    assert crashes == 0, out.stdout
    assert "true cause \\ diagnosed" in out.stdout and "per family" in out.stdout
    payload = json.loads((tmp_path / "out.json").read_text())
    assert payload["summary"]["right"] == right
    assert [s["seed"] for s in payload["scenarios"]] == [0, 1, 2, 3, 11, 34]
    for scenario in payload["scenarios"]:
        assert scenario["label"] or scenario["dropped"]
        if scenario["label"] is None:
            continue
        assert isinstance(scenario["right"], bool) and scenario["answer"]
        assert scenario["exit_code"] in (0, 3)
        if scenario["label"] != "healthy":
            assert scenario["counterfactuals"] and scenario["rule"]
    # labels are cached: a second run reads them
    assert len(list((tmp_path / "cache").glob("labels-*/*.json"))) == 6
