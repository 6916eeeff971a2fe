"""`rlperf validate-train` (also `rlperf validate --train-csv`): the training-step model against
measured training iterations, with the errors by configuration group."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, table


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def render_train_validation(result: object) -> None:
    from rlperf.validate_train import GROUPS, TrainValidation

    assert isinstance(result, TrainValidation)
    fitted = ", ".join(f"{k} = {v * 1e3:.3f} ms" for k, v in result.fitted) or "none (the profile as shipped)"
    console.print(f"training-step model vs {len(result.rows)} measured iterations ({result.profile}); "
                  f"fitted on the fit half: {fitted}")
    t = table("errors (APE = |predicted / measured - 1|; ratio = predicted / measured)", "split", "rows", "MAPE",
              "median APE", "p90 APE", "median ratio")
    for split in ("fit", "holdout", "all"):  # literal tuples keep the Split type
        e = result.summary(split)
        t.add_row(split, str(e.num_rows), _pct(e.mape), _pct(e.median_ape), _pct(e.p90_ape), _ratio(e.median_ratio))
    console.print(t)
    for split in ("fit", "holdout"):
        g = table(f"{split} half by group", "group", "value", "rows", "MAPE", "median APE", "p90 APE", "median ratio")
        for by in GROUPS:
            for ge in result.groups(split):  # type: ignore[arg-type]
                if ge.by == by:
                    e = ge.errors
                    g.add_row(by, str(ge.value), str(e.num_rows), _pct(e.mape), _pct(e.median_ape), _pct(e.p90_ape),
                              _ratio(e.median_ratio))
        console.print(g)
    console.print("split: a row is in the fit half when the first byte of the SHA-256 of its ten configuration "
                  "columns is even (stable across files and runs); fits see only the fit half")


def run_train_validation(path: Path | None, gpu: str, profile: Path | None, fit: bool) -> None:
    from rlperf.validate_train import validate_train

    result = validate_train(path, gpu=gpu, profile_path=str(profile) if profile else None, fit=fit)
    render_train_validation(result)


@app.command("validate-train")
def validate_train_cmd(
    csv_file: Path | None = typer.Argument(None, help="measured iterations in vTrain's column format (default: the shipped vTrain single-node file)"),
    gpu: str = typer.Option("a100_80gb_sxm", "--gpu", help="accelerator the rows ran on"),
    profile: Path | None = typer.Option(None, "--profile", help="hardware profile file applied to every row"),
    fit: bool = typer.Option(False, "--fit", help="fit the backend's per-layer host overhead on the fit half first"),
) -> None:
    """Score the training-step model against measured training iterations (MAPE, by tp/pp/micro-batch/hidden)."""
    run_train_validation(csv_file, gpu, profile, fit)
