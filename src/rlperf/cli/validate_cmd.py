"""`rlperf validate`: predictions against published measurements, and honest calibration."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterable
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, table

if TYPE_CHECKING:
    from rlperf.specs.hardware import Accelerator
    from rlperf.validation_cases import ValidationCase


def _num(x: float) -> str:
    """Three significant digits, thousands grouped (times, ratios and throughputs alike)."""
    return "-" if math.isnan(x) else (f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}")


def _median(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.0f}%"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"


def _mean_text(mean: float, cap: int) -> str:
    """A matching mean, with far extrapolations named rather than printed as huge numbers."""
    if math.isnan(mean):
        return "none (flat)"
    if mean > 10 * cap:
        return "> 10 x cap"
    return "< 1 token" if mean < 1 else _num(mean)


def render_report(report: object, title: str) -> None:
    from rlperf.validate import ValidationReport

    assert isinstance(report, ValidationReport)
    t = table(f"{title}: per case ({report.profile})", "case", "metric", "split", "lengths", "measured",
              "predicted", "error", "bound")
    for c in report.cases:
        if c.length_fit is not None:
            continue
        err = f"{c.error_pct:+.0f}%" if c.ok else "failed"
        bound = _num(c.bound) + (" !" if c.below_bound else "")
        t.add_row(c.id, c.label, c.split, c.lengths, _num(c.measured), _num(c.predicted) if c.ok else "-", err, bound)
    console.print(t)
    fits = report.length_fits
    if fits:
        lf = table(f"{title}: cases whose source publishes no response lengths (not scored): the mean response "
                   "length that matches the measurement", "case", "metric", "split", "measured",
                   "predicted over the swept means", "swept means", "matching mean", "plausible")
        for c in fits:
            f = c.length_fit
            assert f is not None
            m = f.matching_mean_tokens
            lf.add_row(c.id, c.label, c.split, _num(c.measured), f.range_text,
                       ", ".join(_num(x) for x in f.means_tokens), _mean_text(m, f.cap_tokens),
                       "yes" if f.plausible else f"no (outside {f.lower_tokens:,}..{f.cap_tokens:,})")
        console.print(lf)
        ok = sum(1 for c in fits if c.length_fit is not None and c.length_fit.plausible)
        console.print(f"{ok} of {len(fits)} unknown-length cases have a plausible matching mean response length")
    below = sum(c.below_bound for c in report.cases)
    console.print(f"bound: the simulated scenario's work-depth lower bound for the same time; '!' marks {below} "
                  "measured times below it (the scenario as assumed cannot be what ran)")
    failed = [c for c in report.cases if not c.ok]
    if failed:
        ft = table("cases the model could not predict", "case", "reason")
        for c in failed:
            ft.add_row(c.id, c.failure or "")
        console.print(ft)
    s = table(f"{title}: summary of cases with published (or unused) lengths (|error| = |predicted - measured| / measured)", "metric", "split", "cases",
              "median |error|", "within 25%", "within 50%")
    for st in report.summary:
        if st.lengths == "all":
            s.add_row(st.metric, st.split, str(st.num_cases), _median(st.median_abs_error_pct),
                      _pct(st.within_25_pct), _pct(st.within_50_pct))
    console.print(s)
    b = table(f"{title}: by response lengths (published by the source, or not used)", "metric", "lengths", "split",
              "cases", "median |error|", "within 25%", "within 50%")
    for st in report.summary:
        if st.lengths != "all":
            b.add_row(st.metric, st.lengths, st.split, str(st.num_cases), _median(st.median_abs_error_pct),
                      _pct(st.within_25_pct), _pct(st.within_50_pct))
    console.print(b)


def render_skipped(skipped: tuple[object, ...]) -> None:
    if not skipped:
        return
    k = table(f"skipped measurements ({len(skipped)})", "measurement", "reason")
    for sk in skipped:
        k.add_row(getattr(sk, "id", ""), getattr(sk, "reason", ""))
    console.print(k)


def _accelerator(name: str) -> Accelerator | None:
    """The catalog's accelerator ``name`` (None if unknown: that is the case's own error)."""
    from rlperf.errors import SpecError
    from rlperf.specs.hardware_catalog import load_accelerator

    try:
        return load_accelerator(name)
    except SpecError:
        return None


def check_profile_option(profile: Path, cases: Iterable[ValidationCase]) -> None:
    """``--profile`` checked before the work: the file exists, loads and is a valid profile of the
    accelerators the cases ran on (a bad file would otherwise fail every case, and exit 0)."""
    from rlperf.cli.hardware_cmd import check_profile_file, profiles_for
    from rlperf.scenario import ClusterSpec

    check_profile_file(profile, "--profile")
    default = str(ClusterSpec.model_fields["gpu"].default)
    named = {str((sc.get("cluster") or {}).get("gpu", default)) for c in cases for pt in c.points
             for sc in (pt.scenario, pt.baseline or {})}
    profiles_for(sorted({acc.id for acc in map(_accelerator, named) if acc is not None}), profile, "--profile")


@app.command("validate")
def validate_cmd(
    cases: Path | None = typer.Option(None, "--cases", help="cases file (default: the shipped rlperf/data/validation_cases.yaml)"),
    calibrate: bool = typer.Option(False, "--calibrate", help="fit the generic profile parameters on the calibration split and report the hold-out"),
    profile: Path | None = typer.Option(None, "--profile", help="hardware profile file applied to every case (e.g. one written by --calibrate)"),
    out: Path = typer.Option(Path("calibrated-profile.yaml"), "--out", help="where --calibrate writes the fitted profile"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON instead of tables"),
    jobs: int = typer.Option(0, "--jobs", help="worker processes (0: one per CPU core)"),
    train_csv: Path | None = typer.Option(None, "--train-csv", help="score the training-step model against this file of measured iterations instead (vTrain's columns; see `rlperf validate-train`)"),
    errors_out: Path | None = typer.Option(None, "--errors-out", help="write the step-time cases as data for the plan's prediction intervals (src/rlperf/data/step_time_errors.yaml)"),
    force: bool = typer.Option(False, "--force", help="replace --out / --errors-out files that exist"),
) -> None:
    """Compare predictions with published measurements: per case and summarized by metric kind."""
    from rlperf.errors import SpecError
    from rlperf.inputs.ranges import check_jobs

    check_jobs(jobs)
    if train_csv is not None:
        from rlperf.cli.validate_train_cmd import run_train_validation

        # the training-step score runs in this process and prints its tables: these options
        # belong to the case validation and would be silently ignored
        ignored = [name for name, given in (("--cases", cases is not None), ("--json", as_json), ("--jobs", jobs != 0),
                                            ("--errors-out", errors_out is not None),
                                            ("--out", out != Path("calibrated-profile.yaml"))) if given]
        if ignored:
            raise SpecError("--train-csv", f"scores the training-step model alone; {', '.join(ignored)} would be ignored",
                            "--train-csv with --profile and --calibrate (fits the per-layer overhead) only")

        run_train_validation(train_csv, "a100_80gb_sxm", profile, calibrate)
        return
    from rlperf.validate import validate
    from rlperf.validation_cases import load_cases

    from rlperf.outputs import claim

    claim([p for p in ((out if calibrate else None), errors_out) if p is not None], force, "--out")  # before the work
    n_jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
    t0 = time.perf_counter()
    cf = load_cases(cases)
    if profile is not None:
        check_profile_option(profile, cf.cases)
    prof = str(profile) if profile is not None else None
    # One pool for the whole command: its workers keep their stage caches from the uncalibrated
    # run through every calibration grid point to the calibrated run.
    pool_cm: contextlib.AbstractContextManager[Executor | None] = (
        ProcessPoolExecutor(max_workers=n_jobs) if n_jobs > 1 else contextlib.nullcontext(None))
    with pool_cm as pool:
        report = validate(cf, jobs=n_jobs, profile_path=prof, pool=pool)
        payload: dict[str, object] = {"uncalibrated" if prof is None else "profile": report.to_dict()}
        if errors_out is not None:
            import subprocess

            from rlperf.accuracy import errors_document
            from rlperf.outputs import write_text

            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or "unknown"
            write_text(errors_out, errors_document(report.to_dict(), commit, prof))
        fitted = None
        if calibrate:
            from rlperf.calibration import as_scale, describe, fit, write_profile

            def progress(point: dict[str, float], objective: float) -> None:
                # one line per grid point on stderr (--json output stays clean)
                typer.echo(f"calibration: {describe(as_scale(point)) or 'shipped'}: "
                           f"mean |ln(pred/meas)| {objective:.3f}", err=True)

            fitted = fit(cf.cases, jobs=n_jobs, pool=pool, progress=progress)
            label = "calibrated: " + describe(fitted.factors)
            calibrated = validate(cf, jobs=n_jobs, scale=as_scale(fitted.factor_map), profile_label=label, pool=pool)
            hold = [s for s in calibrated.summary if (s.metric, s.split, s.lengths) == ("step_time_s", "holdout", "all")]
            note = (f"Hold-out median |error| on step times: {hold[0].median_abs_error_pct:.0f}% (n = {hold[0].num_cases})."
                    if hold and hold[0].num_cases else "No hold-out step times among the cases.")
            path = write_profile(out, fitted, note)
            payload["calibration"] = {
                "factors": dict(fitted.factors), "num_cases": fitted.num_cases,
                "objective_before": fitted.objective_before, "objective_after": fitted.objective_after,
                "evaluations": [[dict(f), v] for f, v in fitted.evaluations], "profile_file": str(path),
            }
            payload["calibrated"] = calibrated.to_dict()
    wall = time.perf_counter() - t0
    if as_json:
        typer.echo(json.dumps(payload, indent=1, default=float))
        return
    render_report(report, "as shipped" if prof is None else f"profile {prof}")
    if fitted is not None:
        console.print(
            f"calibration: {describe(fitted.factors)} fitted on {fitted.num_cases} "
            f"calibration-split cases with published (or unused) response lengths (mean |ln(pred/meas)| "
            f"{fitted.objective_before:.3f} -> {fitted.objective_after:.3f}); hold-out cases never enter the fit"
        )
        render_report(calibrated, "calibrated")
        console.print(f"wrote the calibrated profile to {path} (use: cluster.profile or --profile)")
    render_skipped(cf.skipped)
    console.print(f"{len(cf.cases)} cases from {cf.path} in {wall:.0f} s on {n_jobs} processes")
