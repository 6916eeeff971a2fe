"""`rlperf analyze`: the work-depth model, symbolic (the taxonomy) and numeric (a scenario)."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, fmt_count, fmt_s, table


DEFAULT_SCENARIO = "grpo-qwen2.5-7b-colocated-sync"
NOTATION = ("P parameters, N=B·G responses, L=L_p+L_r, n_l layers, h hidden, e epochs, M mini-batches, "
            "d/t/p/c/x dp/tp/pp/cp/ep, m micro-batches, s staleness, b bytes/element, t_l per-layer latency")


@app.command("analyze")
def analyze_cmd(
    scenario: str | None = typer.Argument(None, help=f"scenario file or example name (default: {DEFAULT_SCENARIO})",
                                          show_default=False),
    symbolic_only: bool = typer.Option(False, "--symbolic", help="print only the symbolic taxonomy table (no scenario)"),
    as_json: bool = typer.Option(False, "--json", help="print the numbers (with --symbolic: the taxonomy) as JSON"),
) -> None:
    """Work, depth, parallelism W/D and the bounds max(W/P, D) <= T_P <= W/P + D per stage."""
    from rlperf.api import load
    from rlperf.errors import SpecError
    from rlperf.workdepth import STAGES, STRATEGIES, analyze

    if symbolic_only and scenario is not None:  # the taxonomy is the same for every scenario
        raise SpecError("--symbolic", f"prints the taxonomy alone, so the scenario {scenario!r} would be ignored",
                        "--symbolic without a SCENARIO, or a SCENARIO without --symbolic")
    sc = None if symbolic_only else load(scenario or DEFAULT_SCENARIO)  # validate before printing anything
    tables = (("work-depth per stage (symbolic)", STAGES), ("per parallelism strategy (symbolic)", STRATEGIES))
    if sc is None and as_json:
        doc = {"stages": [asdict(r) for r in STAGES], "strategies": [asdict(r) for r in STRATEGIES], "notation": NOTATION}
        typer.echo(json.dumps(doc, indent=1))
        return
    if not as_json:
        for title, rows in tables:
            t = table(title, "what", "work", "depth", "communication", "memory per device")
            for r in rows:
                t.add_row(r.what, r.work, r.depth, r.communication, r.memory_per_device)
            console.print(t)
        console.print(f"[dim]{NOTATION}[/]")
    if sc is None:
        return
    rep = analyze(sc)
    if as_json:
        typer.echo(json.dumps(asdict(rep), indent=1, default=float))
        return
    from rlperf.specs.response_lengths import scenario_lengths

    console.print(scenario_lengths(sc).describe(), markup=False, highlight=False)
    t = table(f"{rep.scenario}: numbers per stage (mean per steady-state step)", "stage", "pool", "P", "FLOPs", "W (GPU·s)",
              "D", "W/D", "max(W/P,D)", "W/P+D", "predicted")
    for s in rep.stages:
        par = f"{s.parallelism:,.0f}" if s.parallelism != float("inf") else "∞"
        t.add_row(s.stage, s.pool, str(s.num_gpus), fmt_count(s.flops), f"{s.work_s:,.1f}", fmt_s(s.depth_s), par,
                  fmt_s(s.lower_bound_s), fmt_s(s.brent_bound_s), fmt_s(s.predicted_s))
    console.print(t)
    console.print(f"step: predicted {fmt_s(rep.step_predicted_s)}, lower bound {fmt_s(rep.step_lower_bound_s)} "
                  f"(W = {rep.iteration_work_s:,.0f} GPU·s over {rep.num_gpus} GPUs, iteration depth {fmt_s(rep.iteration_depth_s)}); "
                  f"gap {rep.step_predicted_s / rep.step_lower_bound_s:.2f}x; the simulation `rlperf simulate` runs "
                  f"(same iterations, same step time)")
