"""``rlperf workloads`` (the preset table) and ``rlperf workload show NAME`` (one preset)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rlperf.cli.app import app
from rlperf.errors import SpecError
from rlperf.inputs.ranges import RUN_STEPS
from rlperf.specs.workload_presets import (
    get_workload_preset,
    list_workload_presets,
    load_workload_preset,
)
from rlperf.specs.workload_summary import LengthSummary, describe

workload_app = typer.Typer(help="Inspect one workload preset.", no_args_is_help=True)
app.add_typer(workload_app, name="workload")


def _console() -> Console:
    # Tables are wider than the 80 columns rich assumes when output is piped.
    return Console(width=max(Console().width, 150))


@app.command("workloads")
def workloads() -> None:
    """List the workload presets (published recipes, algorithms.md §4 and §6)."""
    table = Table(title="rlperf workload presets (response lengths: truncated log-normal)")
    for col in (
        "name",
        "prompts",
        "G",
        "responses",
        "prompt cap",
        "response cap",
        "mean response",
        "at cap",
        "source",
    ):
        table.add_column(
            col,
            justify="left" if col in ("name", "source") else "right",
            no_wrap=col != "source",
            overflow="fold",
        )
    for name in list_workload_presets():
        preset = get_workload_preset(name)
        w, r = preset.workload, preset.workload.response_length
        table.add_row(
            name,
            f"{w.prompts_per_step:,}",
            str(w.group_size),
            f"{w.num_responses:,}",
            f"{w.max_prompt_tokens:,}",
            f"{w.max_response_tokens:,}",
            f"{r.mean_tokens():,.0f}",
            f"{r.fraction_at_cap():.1%}",
            preset.source,
        )
    console = _console()
    console.print(table)
    console.print("Assumptions behind each preset: rlperf workload show NAME")


def _length_row(what: str, s: LengthSummary) -> list[str]:
    return [
        what,
        s.kind,
        f"{s.cap_tokens:,}",
        f"{s.mean_tokens:,.0f}",
        f"{s.p50_tokens:,}",
        f"{s.p90_tokens:,}",
        f"{s.p99_tokens:,}",
        f"{s.fraction_at_cap:.2%}",
        f"{s.num_samples:,}",
        f"{s.sample_mean_tokens:,.0f}",
        f"{s.sample_max_tokens:,}",
        f"{s.sample_fraction_at_cap:.2%}",
    ]


@workload_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Preset name (see `rlperf workloads`).")],
    step: Annotated[int, typer.Option(help="Step whose lengths are sampled.")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the length draws.")] = 0,
) -> None:
    """One preset: quantiles, the lengths sampled for one step, source and assumptions."""
    # the command's own argument and options, not the scenario fields they stand for
    if not 0 <= step < RUN_STEPS.hi:
        raise SpecError("--step", f"{step:,} is outside the plausible range", f"0 to {RUN_STEPS.hi - 1:,.0f} (a run's steps)")
    if seed < 0:
        raise SpecError("--seed", f"{seed} is negative", ">= 0")
    try:
        preset = get_workload_preset(name)
    except SpecError as err:
        raise SpecError("workload", err.problem, err.allowed) from None
    w = load_workload_preset(name, seed=seed)
    summary = describe(w, step)
    console = _console()
    console.print(
        f"{name}: {w.prompts_per_step:,} prompts x G={w.group_size} = "
        f"{w.num_responses:,} responses per step; source: {preset.source}",
        markup=False,
    )
    table = Table(title=f"Lengths in tokens (analytic | sampled at seed {seed}, step {step})")
    for col in (
        "",
        "kind",
        "cap",
        "mean",
        "p50",
        "p90",
        "p99",
        "at cap",
        "n",
        "mean",
        "max",
        "at cap",
    ):
        table.add_column(col, justify="left" if col in ("", "kind") else "right", no_wrap=True)
    table.add_row(*_length_row("prompt", summary.prompt))
    table.add_row(*_length_row("response", summary.response))
    console.print(table)
    console.print(
        f"tokens per step: expected {summary.expected_tokens_per_step:,.0f} "
        f"(responses {summary.expected_response_tokens_per_step:,.0f}); sampled "
        f"{summary.sample_total_tokens:,} (responses {summary.sample_total_response_tokens:,})"
    )
    which = "" if preset.row_part is None else f"; entry {preset.row_part + 1} of 'a / b / c' cells"
    console.print(f"published (algorithms.md §4 row '{preset.table_row}'{which}):", markup=False)
    for key, cell in preset.published:
        console.print(f"  {key}: {cell}", markup=False)
    console.print("assumptions:")
    for line in preset.assumptions:
        console.print(f"  - {line}", markup=False)
