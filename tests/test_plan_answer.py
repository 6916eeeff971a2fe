"""A plan answer a user can act on: lengths stated, an interval, run totals, memory, a launch config.

One small question (Qwen2.5-0.5B on 4 GPUs, 16 x 4 responses, 1k cap) is planned once through
the CLI and once through the Python API (module fixtures); each test checks one piece of it.
"""

from __future__ import annotations

import json
import math
import shlex

import numpy as np
import pytest

import rlperf
from rlperf.accuracy import ErrorData, LengthFitCase, ScoredCase, assumed_interval, error_data, stated_interval
from rlperf.api import PlanAnswer, Question, build_scenario
from rlperf.cli.app import main
from rlperf.errors import SpecError
from rlperf.frameworks import get_framework, import_verl
from rlperf.plan.memory_breakdown import concrete_plan
from rlperf.specs.parallel import TrainLayout
from rlperf.specs.plan import ExecutionMode, Placement, Plan
from rlperf.specs.response_lengths import DEFAULT_SOURCE, choose_response_lengths, parse_token_count
from rlperf.specs.workload_presets import MEAN_OVER_CAP
from tests.test_cli import SMALL as FLAGS  # the same small question as the CLI tests
from tests.test_cli import run as _run

QUESTION: Question = {"model": "Qwen2.5-0.5B", "nodes": 1, "gpus_per_node": 4, "prompts": 16, "group_size": 4,
                      "max_response": 1024}


@pytest.fixture(scope="module")
def answer() -> PlanAnswer:
    return rlperf.plan(**QUESTION, steps=20, end_mean_response=600, lengths=[200, 500], framework="verl", top_k=1)


@pytest.fixture(scope="module")
def screen() -> str:
    import contextlib
    import io

    from rlperf.cli import render

    buf = io.StringIO()
    render.console.file = buf
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            main(["plan", *FLAGS, "--steps", "100", "--framework", "verl"])
    except SystemExit as ex:
        assert not ex.code
    finally:
        render.console.file = None  # type: ignore[assignment]  # back to "whatever sys.stdout is"
    return buf.getvalue()


# ------------------------------------------------------------------ the screen, piece by piece
def test_screen_names_the_question_and_the_assumed_lengths(screen: str) -> None:
    assert "GRPO on Qwen2.5-0.5B, 1x4" in screen
    mean = 1024 * MEAN_OVER_CAP
    assert f"response lengths: log-normal, mean {mean:,.0f}" in screen and DEFAULT_SOURCE.split(" (")[0] in screen


def test_screen_has_the_best_plan_with_an_interval(screen: str) -> None:
    best = next(line for line in screen.splitlines() if line.startswith("best:"))
    # Default lengths: the range is the plan at the means that match published runs, labelled
    # as such (it need not contain the estimate, which assumes mean = cap/3).
    assert "per step (at published runs' lengths " in best
    assert "range: lengths assumed" in screen
    gap = next(line for line in screen.splitlines() if line.startswith("distance to the bound:"))
    assert "x its work-depth bound" in gap and "set by" in gap


def test_screen_has_the_run_totals(screen: str) -> None:
    run = next(line for line in screen.splitlines() if line.startswith("run of 100 steps:"))
    assert "GPU-hours on" in run and "$" in run


def test_screen_has_the_memory_breakdown(screen: str) -> None:
    assert "memory per GPU of 85.0 GB (what CUDA reports): worst case" in screen and "at mean" in screen
    for col in ("weights", "grads", "optimizer", "activations", "logits", "KV cache", "host RAM"):
        assert col in screen
    assert "rollout (generate)" in screen and "actor (train)" in screen


def test_screen_has_the_verl_launch_command_and_it_reimports(screen: str) -> None:
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("launch with verl"))
    block = []
    for line in lines[start + 1:]:
        block.append(line)
        if not line.endswith("\\"):
            break
    tokens = shlex.split(" ".join(x.rstrip("\\") for x in block))
    assert tokens[:2] == ["python3", "-m"]
    overrides = [t for t in tokens[3:]]
    spec, _ = import_verl(None, overrides)
    assert spec.model == "Qwen2.5-0.5B" and spec.cluster.num_nodes == 1


def test_screen_fits_one_screen(screen: str) -> None:
    assert len(screen.splitlines()) <= 80, len(screen.splitlines())


# ------------------------------------------------------------------ the API's typed answer
def test_api_answer_is_typed_and_consistent(answer: PlanAnswer) -> None:
    b = answer.best
    assert isinstance(answer, rlperf.PlanAnswer) and b.sim is not None
    assert answer.interval.predicted_s == b.step_time_s
    assert answer.framework == "verl" and answer.launch is not None and answer.launch.framework == "verl"
    assert get_framework("verl").why_not_plan(b.plan) is None
    # verl can say the plan's shape: no placement, mode or layout it cannot express.
    shape = ("mode ", "partial rollout", "stage fusion", "hybrid pools", "ZeRO-", "Ulysses", "GPipe")
    assert not [m for m in answer.launch.not_expressible if any(k in m for k in shape)], answer.launch.not_expressible
    # The plan the answer names is the one simulated, with dp and replicas of its pools.
    pools, assign = b.plan.placement.resolve(b.num_gpus)
    size = {p.name: p.num_gpus for p in pools}
    lay = answer.best_plan.layouts["actor"]
    assert lay.dp * lay.tp * lay.pp * lay.cp == size[assign["actor"]]
    assert answer.best_plan.rollout.replicas * answer.best_plan.rollout.tp == size[assign["generate"]]


def test_what_ifs_the_framework_cannot_run_say_so(answer: PlanAnswer) -> None:
    assert answer.explanation is not None
    refused = [w for w in answer.explanation.what_ifs if "partial rollout" in w.change or "fusion" in w.change]
    assert refused and all(w.note.startswith("infeasible: verl does not run") for w in refused), refused


def test_run_totals_sum_the_step_curve(answer: PlanAnswer) -> None:
    run = answer.run
    assert run is not None and run.steps == 20 and len(run.step_times_s) == 20
    assert run.total_s == pytest.approx(sum(run.step_times_s))
    assert run.gpu_hours == pytest.approx(run.hours * run.num_gpus)
    # Responses grow from the assumed mean to 600 tokens: the curve rises and ends at the last point.
    assert run.points[0].step_time_s == answer.best.step_time_s
    assert run.step_times_s[-1] == pytest.approx(run.points[-1].step_time_s)
    assert run.points[-1].mean_response_tokens == pytest.approx(600, rel=1e-3)
    assert run.step_times_s[-1] > run.step_times_s[0]


def test_length_sweep_rises_with_the_mean(answer: PlanAnswer) -> None:
    (a, b) = answer.sweep
    assert a.mean_response_tokens == pytest.approx(200, rel=1e-3) and b.mean_response_tokens == pytest.approx(500, rel=1e-3)
    assert a.step_time_s < b.step_time_s


def test_json_carries_every_piece(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["plan", *FLAGS, "--steps", "10", "--mean-response", "300", "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    jsonschema = pytest.importorskip("jsonschema")
    from pathlib import Path

    jsonschema.validate(d, json.loads((Path(__file__).parents[1] / "docs" / "plan.schema.json").read_text()))
    assert d["response_lengths"]["stated"] is True and d["response_lengths"]["mean_tokens"] == pytest.approx(300, rel=1e-3)
    assert d["step_time_interval"]["basis"] == "stated"
    assert d["run"]["steps"] == 10 and d["run"]["total_s"] == pytest.approx(10 * d["best"]["step_time_s"])
    assert {r["role"] for r in d["memory"]["best"]} >= {"rollout", "actor"}
    assert d["best"]["staleness_bound"] == Plan.model_validate(d["best"]["plan"]).mode.effective_staleness
    gap = d["explanation"]["bound_gap"]  # what keeps the best plan from its bound, named
    assert gap["ratio"] == pytest.approx(d["explanation"]["gap"]) and gap["terms"][0]["detail"] in gap["headline"]


# ------------------------------------------------------------------ lengths as a stated input
def test_default_lengths_are_the_import_rule() -> None:
    sc, choice = build_scenario(**QUESTION)
    assert choice.source == DEFAULT_SOURCE and not choice.stated
    assert sc.workload.response_length.mean_tokens() == pytest.approx(1024 * MEAN_OVER_CAP, rel=1e-6)
    from rlperf.frameworks.common import generic_workload
    from rlperf.frameworks.report import Recorder
    from rlperf.scenario import resolve_workload

    imported = generic_workload(16, 4, 1024, 1024, None, Recorder("verl", "test"))  # what `rlperf import` builds
    assert resolve_workload(imported).response_length == sc.workload.response_length


def test_stated_lengths() -> None:
    by_mean = choose_response_lengths(16384, mean_tokens=5000)
    assert by_mean.stated and by_mean.distribution.mean_tokens() == pytest.approx(5000, rel=1e-6)
    by_median = choose_response_lengths(16384, median_tokens=5000)
    assert by_median.distribution.quantile(0.5) == pytest.approx(5000, abs=1)
    seer = choose_response_lengths(65536, preset="seer-moonlight")
    assert seer.stated and seer.distribution.mean_tokens() == pytest.approx(22386, rel=1e-6)
    unpublished = choose_response_lengths(16384, preset="dapo-qwen2.5-32b")
    assert not unpublished.stated and unpublished.distribution.mean_tokens() == pytest.approx(16384 / 3, rel=1e-6)


@pytest.mark.parametrize("kwargs, flag", [
    ({"median_tokens": 50000}, "--median-response"),
    ({"mean_tokens": 16384}, "--mean-response"),
    ({"mean_tokens": 10, "median_tokens": 10}, "--median-response"),
])
def test_lengths_above_the_cap_are_refused_in_one_line(kwargs: dict[str, float], flag: str) -> None:
    with pytest.raises(SpecError) as err:
        choose_response_lengths(16384, **kwargs)  # type: ignore[arg-type]
    assert flag in str(err.value) and "\n" not in str(err.value)


def test_a_scenario_median_above_its_cap_is_flagged_in_its_header_line() -> None:
    from rlperf.specs.lengths import LogNormalLength
    from rlperf.specs.response_lengths import LengthChoice

    line = LengthChoice(LogNormalLength(median_tokens=50_000, sigma=1.0, cap_tokens=16_384), "scenario x").describe()
    assert "median above the cap" in line and "\n" not in line
    ok = LengthChoice(LogNormalLength(median_tokens=5_000, sigma=1.0, cap_tokens=16_384), "scenario x").describe()
    assert "median above the cap" not in ok


def test_token_counts_parse() -> None:
    assert [parse_token_count(x, "--lengths") for x in ("2k", "5000", "1.5k")] == [2000, 5000, 1500]
    with pytest.raises(SpecError):
        parse_token_count("lots", "--lengths")


# ------------------------------------------------------------------ the interval
def test_stated_range_is_the_quantile_range_of_the_stored_validation_errors() -> None:
    d = error_data()
    assert len(d.scored) >= 5
    ratios = [c.ratio for c in d.scored]
    iv = stated_interval(100.0)
    assert iv.low_s == pytest.approx(100 * np.quantile(ratios, 0.1)) and iv.high_s == pytest.approx(100 * np.quantile(ratios, 0.9))
    assert iv.num_cases == len(ratios) and iv.basis == "stated"


def test_ranges_move_with_the_data() -> None:
    exact = ErrorData(tuple(ScoredCase(str(i), 10.0, 10.0) for i in range(5)), (), "test")
    iv = stated_interval(42.0, exact)
    assert iv.low_s == pytest.approx(42.0) and iv.high_s == pytest.approx(42.0)
    slow = ErrorData(tuple(ScoredCase(str(i), 20.0, 10.0) for i in range(5)), (), "test")
    assert stated_interval(42.0, slow).low_s == pytest.approx(84.0)
    assert math.isnan(stated_interval(42.0, ErrorData((), (), "none")).low_s)
    fits = ErrorData((), tuple(LengthFitCase(str(i), 1000.0 * (i + 1), 10_000) for i in range(5)), "test")
    lo, hi = fits.implied_means(20_000)
    assert lo == pytest.approx(20_000 * np.quantile([0.1, 0.2, 0.3, 0.4, 0.5], 0.1))
    assert hi == pytest.approx(20_000 * np.quantile([0.1, 0.2, 0.3, 0.4, 0.5], 0.9))
    # Kept within the means validate sweeps: at least min(128, cap/4), at most cap/2.
    assert fits.implied_means(400) == pytest.approx((100.0, 400 * np.quantile([0.1, 0.2, 0.3, 0.4, 0.5], 0.9)))
    assert fits.implied_means(100) == pytest.approx((25.0, 46.0))
    assert ErrorData((), (LengthFitCase("x", 9000.0, 10_000),), "t").implied_means(1000) == pytest.approx((500.0, 500.0))
    iv = assumed_interval(50.0, 70.0, 30.0, (lo, hi), fits)
    assert (iv.low_s, iv.high_s, iv.basis, iv.num_cases) == (30.0, 70.0, "assumed", 5)


def test_each_profile_gets_its_own_measured_errors() -> None:
    """The calibrated profile's ranges rest on its own validation errors (its predictions are
    slower, so measured / predicted sits nearer 1 than the shipped profiles'); a profile file
    whose errors were never measured gets the shipped ones, and its ranges say so."""
    shipped, calibrated = error_data(), error_data("calibrated")
    assert {c.id for c in calibrated.scored} == {c.id for c in shipped.scored}
    med = {name: float(np.median([c.ratio for c in d.scored])) for name, d in (("shipped", shipped), ("cal", calibrated))}
    assert abs(math.log(med["cal"])) < abs(math.log(med["shipped"]))
    assert shipped.note == "" and "calibrated" in calibrated.note
    assert "calibrated" in stated_interval(10.0, calibrated).describe()
    other = error_data("my-profile.yaml")
    assert other.scored == shipped.scored and "not with the profile file my-profile.yaml" in other.note
    iv = assumed_interval(5.0, 6.0, 4.0, (1.0, 2.0), other)
    assert iv.describe().endswith(other.note) and iv.scaled(2.0).note == other.note
    assert "profile file" not in stated_interval(10.0).describe()


def test_assumed_lengths_range_is_the_plan_at_the_implied_means(answer: PlanAnswer) -> None:
    iv = answer.interval
    assert iv.basis == "assumed" and iv.mean_range_tokens is not None
    lo, hi = error_data().implied_means(1024)
    assert iv.mean_range_tokens == pytest.approx((lo, hi))
    # Longer responses never make this plan faster: the range is ordered like the means.
    assert iv.low_s <= iv.high_s


# ------------------------------------------------------------------ the framework filter
def test_verl_refuses_what_its_matrix_does_not_mark_supported() -> None:
    verl = get_framework("verl")
    assert verl.why_not_plan(Plan()) is None
    partial = Plan(mode=ExecutionMode(kind="partial_rollout", token_budget=512))
    assert "partial" in (verl.why_not_plan(partial) or "")
    assert "fusion" in (verl.why_not_plan(Plan(mode=ExecutionMode(fusion=True))) or "")
    split = Plan(placement=Placement(kind="disaggregated", rollout_gpus=4), mode=ExecutionMode(kind="one_step_off"))
    assert verl.why_not_plan(split) is None
    assert "ZeRO-3" in (verl.why_not_plan(Plan(layouts={"actor": TrainLayout(tp=2)})) or "")
    assert get_framework("OpenRLHF").why_not_plan(Plan(layouts={"actor": TrainLayout(tp=2)})) is None


def test_concrete_plan_sets_dp_and_replicas() -> None:
    p = concrete_plan(Plan(placement=Placement(kind="disaggregated", rollout_gpus=8)), 32)
    assert p.layouts["actor"].dp == 24 and p.rollout.replicas == 8 // p.rollout.tp


def test_analyze_and_simulate_give_one_step_time() -> None:
    sc, _ = build_scenario(**QUESTION)
    assert rlperf.analyze(sc).step_predicted_s == rlperf.simulate(sc).step_time_s


def test_missing_scenario_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["analyze", "no/such/file.yaml"], capsys)
    assert code == 2 and out == "" and "file not found: no/such/file.yaml" in err


def test_readme_example_uses_real_names() -> None:
    """The README's Python example calls rlperf.plan with keywords it takes and reads fields the
    answer has (checked without running its 4-node search)."""
    import ast
    import dataclasses
    import inspect
    import re
    from pathlib import Path

    from rlperf.api import RunTotals, plan

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## Python API.*?```python\n(.*?)```", readme, re.S)
    assert code is not None
    tree = ast.parse(code.group(1))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "rlperf.plan")
    allowed = set(inspect.signature(plan).parameters) | set(Question.__annotations__)
    assert {k.arg for k in call.keywords} <= allowed
    fields = {f.name for f in dataclasses.fields(PlanAnswer)} | {"best"}
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "ans"}
    assert used <= fields, used - fields
    run_used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "ans.run"}
    assert run_used <= {f.name for f in dataclasses.fields(RunTotals)} | {"hours", "gpu_hours"}
