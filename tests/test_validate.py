"""Validation pipeline: the cases file format, the error statistics, calibration mechanics, and
a small subset of the shipped cases end to end (the pipeline, not the error values)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from rlperf.errors import SpecError
from rlperf.validate import CaseResult, error_stats, run_cases, summarize, validate
from rlperf.validation_cases import CaseFile, calibration_split, deep_merge, load_cases
from tests.helpers.scenarios import SMALL_SCENARIO



def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "cases.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _case(**over: object) -> dict:
    base = {
        "id": "c1",
        "source_url": "https://example.org/a",
        "metric": {"kind": "step_time_s"},
        "measured": 10.0,
        "lengths": "published",
        "scenario": {"template": "small"},
    }
    base.update(over)
    return base


UNKNOWN_LENGTHS = {
    **SMALL_SCENARIO,
    "workload": {**SMALL_SCENARIO["workload"],
                 "response_length": {"kind": "lognormal", "mean_tokens": "unknown", "sigma": 1.0, "cap_tokens": 1024}},
}


def _file(*cases: dict) -> dict:
    return {"version": 1, "simulation": {"iterations": 2, "warmup": 1},
            "templates": {"small": SMALL_SCENARIO, "small-unknown": UNKNOWN_LENGTHS},
            "cases": list(cases), "skipped": [{"id": "x", "reason": "no hardware given"}]}


# ---------------------------------------------------------------------------- file format
def test_shipped_file_parses_with_unique_ids_and_both_splits() -> None:
    cf = load_cases(check=False)
    ids = [c.id for c in cf.cases]
    assert len(ids) == len(set(ids)) > 20
    assert {c.split for c in cf.cases} == {"calibration", "holdout"}
    assert all(s.reason for s in cf.skipped)
    for c in cf.cases:
        assert c.spec.source_url.startswith("http")
        assert (c.baseline is not None) == (c.spec.metric.kind == "speedup")
        assert "simulation" in c.scenario  # the file's default or the case's own


def test_templates_deep_merge_and_defaults(tmp_path: Path) -> None:
    over = _case(scenario={"template": "small", "cluster": {"num_nodes": 2}, "plan": {"rollout": {"tp": 2}}})
    cf = load_cases(_write(tmp_path, _file(over)))
    sc = cf.cases[0].scenario
    assert sc["cluster"] == {"gpu": "H100", "num_nodes": 2, "gpus_per_node": 8}
    assert sc["plan"]["rollout"] == {"tp": 2} and sc["plan"]["mode"] == {"kind": "sync"}
    assert sc["simulation"] == {"iterations": 2, "warmup": 1}
    assert sc["name"] == "c1"
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": [1]}) == {"a": {"b": 1, "c": 3}, "d": [1]}


@pytest.mark.parametrize(
    ("case", "field"),
    [
        (_case(measured=None), "cases[c1].measured"),
        (_case(metric={"kind": "stage_time_s"}), "cases[c1].metric"),
        (_case(metric={"kind": "speedup"}), "cases[c1]"),
        (_case(scenario={"template": "nope"}), "cases[c1].scenario.template"),
        (_case(scenario={"template": "small", "plan": {"rollout": {"tpp": 2}}}), "cases[c1].scenario.plan.rollout.tpp"),
        (_case(scenario={"template": "small", "algorithm": {"name": "GRPPO"}}), "cases[c1].scenario.algorithm"),
    ],
)
def test_malformed_case_is_one_line_naming_case_and_field(tmp_path: Path, case: dict, field: str) -> None:
    with pytest.raises(SpecError) as ei:
        load_cases(_write(tmp_path, _file(case)))
    msg = str(ei.value)
    assert "\n" not in msg
    assert ei.value.field.startswith(field), msg


def test_duplicate_ids_and_missing_file_are_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"cases\[c1\]\.id: duplicate"):
        load_cases(_write(tmp_path, _file(_case(), _case())))
    with pytest.raises(SpecError, match="file not found"):
        load_cases(tmp_path / "missing.yaml")


def test_split_is_by_source_and_stable() -> None:
    a = calibration_split("https://example.org/a")
    assert a == calibration_split("https://example.org/a")
    sides = {calibration_split(f"https://example.org/{i}") for i in range(20)}
    assert sides == {"calibration", "holdout"}


# ---------------------------------------------------------------------------- statistics
def _r(measured: float, predicted: float, metric: str = "step_time_s", split: str = "calibration",
       lengths: str = "published", failure: str | None = None) -> CaseResult:
    return CaseResult(id=f"{metric}{measured}{predicted}", metric=metric, label=metric, split=split, lengths=lengths,
                      source_url="u", measured=measured, predicted=predicted, failure=failure)


def test_error_stats_on_synthetic_numbers() -> None:
    rs = [_r(100, 110), _r(100, 70), _r(100, 160), _r(100, 98), _r(100, math.nan, failure="oom")]
    st = error_stats(rs)
    # errors: +10, -30, +60, -2 -> |.| sorted 2, 10, 30, 60 -> median 20; within 25%: 2 of 4; within 50%: 3 of 4
    assert st.num_cases == 4
    assert st.median_abs_error_pct == pytest.approx(20.0)
    assert st.within_25_pct == pytest.approx(0.5)
    assert st.within_50_pct == pytest.approx(0.75)
    assert rs[0].error_pct == pytest.approx(10.0) and rs[1].log_error == pytest.approx(abs(math.log(0.7)))
    assert replace(rs[0], bound=120.0).below_bound and not replace(rs[0], bound=80.0).below_bound
    empty = error_stats([])
    assert empty.num_cases == 0 and math.isnan(empty.median_abs_error_pct)


def test_summarize_groups_by_kind_split_and_lengths() -> None:
    rs = [_r(100, 110), _r(100, 200, split="holdout"), _r(2.0, 1.0, metric="speedup", lengths="not_used")]
    by = {(s.metric, s.split, s.lengths): s for s in summarize(rs)}
    assert by[("step_time_s", "calibration", "all")].median_abs_error_pct == pytest.approx(10.0)
    assert by[("step_time_s", "holdout", "all")].median_abs_error_pct == pytest.approx(100.0)
    assert by[("step_time_s", "all", "all")].num_cases == 2
    assert by[("speedup", "calibration", "all")].median_abs_error_pct == pytest.approx(50.0)
    assert by[("all", "all", "all")].num_cases == 3
    assert by[("all", "all", "not_used")].num_cases == 1
    assert by[("step_time_s", "all", "published")].num_cases == 2
    assert ("throughput", "all", "all") not in by  # kinds without cases are left out


# ---------------------------------------------------------------------------- unknown lengths
def test_length_fit_interpolates_in_log_log_and_judges_plausibility() -> None:
    from rlperf.validate import LengthFit

    f = LengthFit((100.0, 1000.0, 10000.0), (10.0, 100.0, 1000.0), 300.0, 128, 20000)
    assert f.matching_mean_tokens == pytest.approx(3000.0)
    assert f.plausible
    low = replace(f, measured=5.0)  # below the swept range: extrapolated, shorter than plausible
    assert low.matching_mean_tokens == pytest.approx(50.0) and not low.plausible
    long = replace(f, measured=5000.0)
    assert long.matching_mean_tokens == pytest.approx(50000.0) and not long.plausible  # beyond the cap
    flat = LengthFit((100.0, 1000.0), (7.0, 7.0), 9.0, 128, 2048)
    assert math.isnan(flat.matching_mean_tokens) and not flat.plausible


def test_unknown_lengths_must_be_declared_both_ways(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="mean_tokens"):  # a guessed mean under lengths: unknown
        load_cases(_write(tmp_path, _file(_case(lengths="unknown"))))
    with pytest.raises(SpecError, match="mean_tokens"):  # mean unknown but lengths: published
        load_cases(_write(tmp_path, _file(_case(scenario={"template": "small-unknown"}))))


def test_unknown_length_case_is_a_length_fit_not_an_error(tmp_path: Path) -> None:
    cases = [_case(id="known"), _case(id="unknown", lengths="unknown", scenario={"template": "small-unknown"})]
    cf = load_cases(_write(tmp_path, _file(*cases)))
    sweep = cf.cases[1].sweep
    assert [p.mean_tokens for p in sweep] == [128.0, 256.0, 512.0]  # 128 .. cap/2, geometric
    assert {p.scenario["workload"]["response_length"]["mean_tokens"] for p in sweep} == {128.0, 256.0, 512.0}
    rep = validate(cf, jobs=1)
    got = {c.id: c for c in rep.cases}
    fit = got["unknown"].length_fit
    assert fit is not None and got["known"].length_fit is None
    assert list(fit.predicted) == sorted(fit.predicted)  # longer responses, longer steps
    assert rep.stats("all", "all").num_cases == 1  # only the published-length case is scored
    assert rep.to_dict()["length_fits"]["cases"] == 1


# ---------------------------------------------------------------------------- end to end
def test_small_file_end_to_end(tmp_path: Path) -> None:
    """Step time, stage time, stage share, throughput, speedup and sync time on a 0.5B model."""
    cases = [
        _case(id="step"),
        _case(id="gen", metric={"kind": "stage_time_s", "stages": ["generate"]}),
        _case(id="share", metric={"kind": "stage_share", "stages": ["generate"]}, measured=0.5),
        _case(id="tput", metric={"kind": "throughput", "unit": "tokens_per_s_per_gpu", "tokens": "generated"}, measured=1e3),
        _case(id="speedup", metric={"kind": "speedup"}, measured=1.2,
              scenario={"template": "small", "plan": {"placement": {"kind": "disaggregated", "rollout_gpus": 4},
                                                      "mode": {"kind": "one_step_off"}},
                        "simulation": {"iterations": 3, "warmup": 1}},
              baseline={"template": "small"}),
        _case(id="sync", metric={"kind": "weight_sync_time_s"}, measured=0.1, source_url="https://example.org/b"),
        _case(id="nostage", metric={"kind": "stage_time_s", "stages": ["no_such_stage"]}),
    ]
    cf = load_cases(_write(tmp_path, _file(*cases)))
    rep = validate(cf, jobs=1)
    got = {c.id: c for c in rep.cases}
    for cid in ("step", "gen", "share", "tput", "speedup", "sync"):
        assert got[cid].ok, got[cid].failure
        assert got[cid].predicted > 0 and math.isfinite(got[cid].predicted)
    assert 0 < got["share"].predicted <= 1
    for cid in ("step", "gen"):  # time metrics carry the scenario's work-depth lower bound
        assert 0 < got[cid].bound < math.inf
    assert math.isnan(got["share"].bound) and not got["share"].below_bound
    assert not got["nostage"].ok and "no_such_stage" in (got["nostage"].failure or "")
    assert rep.stats("all", "all").num_cases == 6
    assert rep.skipped[0].id == "x"
    # Deterministic and independent of the number of processes.
    again = run_cases(cf.cases, jobs=2)
    assert [(c.id, c.predicted) for c in again if c.ok] == [(c.id, c.predicted) for c in rep.cases if c.ok]


def test_shipped_subset_runs(tmp_path: Path) -> None:
    """Three shipped cases with shortened simulations: the shipped scenarios simulate."""
    cf = load_cases()
    pick = {"verl-ckptengine-qwen2.5-math-7b-off", "verl-fp8-rollout-qwen3-8b", "rollpacker-char-verl-14b-math"}
    short = {"iterations": 2, "warmup": 1}
    def shorten(p):  # type: ignore[no-untyped-def]
        return replace(p, scenario={**p.scenario, "simulation": short},
                       baseline=None if p.baseline is None else {**p.baseline, "simulation": short})

    sub = tuple(
        replace(shorten(c), sweep=tuple(shorten(p) for p in c.sweep[::2]))  # lowest and highest mean
        for c in cf.cases if c.id in pick
    )
    assert len(sub) == 3
    rep = validate(CaseFile(cf.path, sub, ()), jobs=1)
    for c in rep.cases:
        assert c.ok, (c.id, c.failure)
        if c.length_fit is None:
            assert math.isfinite(c.error_pct)
        else:  # lengths not published: predictions at the swept means instead of an error
            assert len(c.length_fit.predicted) == 2 and all(v > 0 for v in c.length_fit.predicted)


# ---------------------------------------------------------------------------- calibration
def test_scale_profile_caps_fractions_and_scales_dtype_table() -> None:
    from rlperf.calibration import scale_profile
    from rlperf.specs.hardware_catalog import load_profile

    p = load_profile("H100")
    s = scale_profile(p, {"decode": 2.0, "compute": 0.5, "engine_step": 3e-3})
    assert s.decode_hbm_efficiency == 1.0  # capped
    assert s.matmul_efficiency == pytest.approx(p.matmul_efficiency * 0.5)
    assert s.attention_efficiency == pytest.approx(p.attention_efficiency * 0.5)
    assert all(s.matmul_efficiency_by_dtype[k] == pytest.approx(v * 0.5) for k, v in p.matmul_efficiency_by_dtype.items())
    assert s.hbm_efficiency == p.hbm_efficiency  # not a calibrated field
    assert p.engine_step_overhead_s == pytest.approx(2.14e-3) and s.engine_step_overhead_s == 3e-3  # a set parameter


def test_fit_uses_only_calibration_cases_and_finds_the_grid_optimum(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A synthetic model: case "gen" is off by 0.8 / decode, case "upd" by 1.15 / compute, case
    "sync" (lengths not used) by 0.5 + 500 s x the per-tensor sync cost; nothing depends on the
    engine step overhead or the engine's parameter walk, which stay at their neutral points (the
    shipped values)."""
    import rlperf.calibration as cal
    from rlperf.specs.hardware_catalog import load_profile

    cases = (_case(id="gen", source_url="https://example.org/d", lengths="published"),
             _case(id="upd", source_url="https://example.org/e", lengths="published"),
             _case(id="assumed", source_url="https://example.org/e", lengths="unknown", scenario={"template": "small-unknown"}),
             _case(id="sync", source_url="https://example.org/e", lengths="not_used"),
             _case(id="held", source_url="https://example.org/a", lengths="published"))
    cf = load_cases(_write(tmp_path, _file(*cases)), check=False)
    assert [c.split for c in cf.cases] == ["calibration"] * 4 + ["holdout"]
    seen_ids: set[str] = set()

    def fake_run(cases, scale=(), jobs=1, profile_path=None, pool=None):  # type: ignore[no-untyped-def]
        f = dict(scale)
        out = []
        for c in cases:
            seen_ids.add(c.id)
            off = {"gen": 0.8 / f.get("decode", 1.0), "upd": 1.15 / f.get("compute", 1.0),
                   "sync": 0.5 + 500 * f.get("sync_tensor", 0.0)}[c.id]
            out.append(_r(c.spec.measured, c.spec.measured * off, split=c.split))
        return tuple(out)

    monkeypatch.setattr(cal, "run_cases", fake_run)
    res = cal.fit(cf.cases)
    assert res.factor_map == {"compute": 1.15, "decode": 0.8, "engine_step": 2.14e-3, "engine_load": 0.0, "sync_tensor": 1e-3,
                              "sync_bucket": 0.0, "fsdp_layer": 0.0, "load_walk": 1.83e-6}
    assert res.objective_after == pytest.approx(0.0, abs=1e-12)
    assert res.objective_before > 0.1
    assert res.num_cases == 3
    assert seen_ids == {"gen", "upd", "sync"}  # neither the hold-out nor assumed-length cases enter the fit
    path = cal.write_profile(tmp_path / "prof.yaml", res)
    loaded = load_profile("H100", path)
    shipped = load_profile("H100")
    assert loaded.decode_hbm_efficiency == pytest.approx(shipped.decode_hbm_efficiency * 0.8, abs=1e-4)
    assert loaded.matmul_efficiency == pytest.approx(min(1.0, shipped.matmul_efficiency * 1.15), abs=1e-4)
    assert loaded.hbm_efficiency == shipped.hbm_efficiency
    assert loaded.weight_sync_tensor_overhead_s == 1e-3 and loaded.engine_step_overhead_s == shipped.engine_step_overhead_s
    assert cal.describe(res.factors) == ("compute x1.15, decode x0.8, engine_load = 0 ms, engine_step = 2.14 ms, "
                                         "fsdp_layer = 0 ms, load_walk = 0.00183 ms, sync_bucket = 0 ms, sync_tensor = 1 ms")


def test_fit_runs_every_grid_point_in_one_pool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One executor for the whole fit (its workers keep their stage caches): every evaluation
    gets the same pool, and fit starts no pool of its own when given one."""
    from concurrent.futures import ThreadPoolExecutor

    import rlperf.calibration as cal

    cases = (_case(id="a", source_url="https://example.org/d"),)
    cf = load_cases(_write(tmp_path, _file(*cases)), check=False)
    pools: list[object] = []

    def fake_run(cases, scale=(), jobs=1, profile_path=None, pool=None):  # type: ignore[no-untyped-def]
        pools.append(pool)
        c = dict(scale).get("compute", 1.0)
        return tuple(_r(case.spec.measured, case.spec.measured * 1.15 / c) for case in cases)

    def no_new_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("fit started a pool of its own")

    monkeypatch.setattr(cal, "run_cases", fake_run)
    monkeypatch.setattr(cal, "ProcessPoolExecutor", no_new_pool)
    with ThreadPoolExecutor(max_workers=2) as pool:
        res = cal.fit(cf.cases, jobs=2, pool=pool)
    assert res.factor_map["compute"] == 1.15
    assert len(pools) > 10 and all(p is pool for p in pools)


def test_fit_keeps_parameters_no_case_depends_on_at_their_neutral_value(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """A parameter that moves the predictions by rounding noise only (1e-15) is not identified:
    it stays neutral (it took a sync-only fit to decode x0.9 and an 8 ms engine step)."""
    import rlperf.calibration as cal

    cases = (_case(id="a", source_url="https://example.org/d"),)
    cf = load_cases(_write(tmp_path, _file(*cases)), check=False)

    def fake_run(cases, scale=(), jobs=1, profile_path=None, pool=None):  # type: ignore[no-untyped-def]
        f = dict(scale)
        noise = 1e-15 * (f.get("engine_step", 0.0) * 1e3 + f.get("decode", 1.0))
        off = 1.15 / f.get("compute", 1.0) - noise
        return tuple(_r(case.spec.measured, case.spec.measured * off) for case in cases)

    monkeypatch.setattr(cal, "run_cases", fake_run)
    res = cal.fit(cf.cases)
    assert res.factor_map["compute"] == 1.15
    assert res.factor_map["decode"] == 1.0
    assert res.factor_map["engine_step"] == cal.PARAMS["engine_step"].neutral


def test_fit_never_makes_a_metric_of_its_split_worse(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A synthetic model where lowering ``compute`` fixes two step times (lowering the mean
    |ln| loss) but doubles the error of the one stage time: every such point is infeasible, so
    the fit keeps the stage time's median and settles where no metric gets worse."""
    import rlperf.calibration as cal

    cases = tuple(_case(id=i, source_url="https://example.org/d", **kw) for i, kw in (
        ("a", {}), ("b", {}), ("s", {"metric": {"kind": "stage_time_s", "stages": ["generate"]}})))
    cf = load_cases(_write(tmp_path, _file(*cases)), check=False)

    def fake_run(cases, scale=(), jobs=1, profile_path=None, pool=None):  # type: ignore[no-untyped-def]
        c = dict(scale).get("compute", 1.0)
        out = []
        for case in cases:
            off = 1.3 / c if case.id != "s" else 1.1 / c ** 2
            out.append(_r(case.spec.measured, case.spec.measured * off, metric=case.spec.metric.kind))
        return tuple(out)

    monkeypatch.setattr(cal, "run_cases", fake_run)
    res = cal.fit(cf.cases)
    shipped = fake_run(cf.cases)
    assert not cal.worse_than(fake_run(cf.cases, cal.as_scale(res.factor_map)), shipped)
    assert res.objective_after <= res.objective_before
    assert res.factor_map["compute"] >= 1.0  # lower compute would worsen the stage time
    assert cal.worse_than(fake_run(cf.cases, (("compute", 0.8),)), shipped)


# ---------------------------------------------------------------------------- CLI
def test_cli_validate_cases_file_json_table_profile_and_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from typer.testing import CliRunner

    from rlperf.calibration import CalibrationResult, write_profile
    from rlperf.cli.app import _register, app, main

    _register()
    path = _write(tmp_path, _file(_case(id="step"), _case(id="gen", metric={"kind": "stage_time_s", "stages": ["generate"]})))
    runner = CliRunner()
    out = runner.invoke(app, ["validate", "--cases", str(path), "--json", "--jobs", "1"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)["uncalibrated"]
    assert [c["id"] for c in rep["cases"]] == ["step", "gen"] and rep["skipped"][0]["id"] == "x"
    table = runner.invoke(app, ["validate", "--cases", str(path), "--jobs", "1"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "median |error|" in table.output and "no hardware given" in table.output
    prof = write_profile(tmp_path / "p.yaml", CalibrationResult((("compute", 0.5), ("decode", 0.5)), 1, 1.0, 0.5, ()))
    slow = runner.invoke(app, ["validate", "--cases", str(path), "--json", "--jobs", "1", "--profile", str(prof)])
    assert slow.exit_code == 0, slow.output
    slow_rep = json.loads(slow.output)["profile"]
    assert slow_rep["cases"][0]["predicted"] > rep["cases"][0]["predicted"]  # half the efficiency: slower
    bad = _write(tmp_path, _file(_case(metric={"kind": "stage_time_s"})))
    with pytest.raises(SystemExit) as ei:
        main(["validate", "--cases", str(bad)])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cases[c1].metric") and "\n" not in err


def test_calibration_blocks_cover_every_parameter_once() -> None:
    from rlperf.calibration import BLOCKS, PARAMS, as_scale

    names = [n for block in BLOCKS for n in block]
    assert sorted(names) == sorted(PARAMS) and len(names) == len(set(names))
    for p in PARAMS.values():
        assert p.neutral in p.grid  # the shipped profile is always a candidate
    assert as_scale({n: p.neutral for n, p in PARAMS.items()}) == ()  # neutral = no change
