"""`rlperf simulate SCENARIO`: simulate RL iterations, print a summary, write JSON and a trace."""

from __future__ import annotations

from pathlib import Path

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, fmt_bytes, fmt_s, question_line, table
from rlperf.sim.result import SimResult


def render_result(r: SimResult) -> None:
    head = table(f"{r.scenario}: {r.algorithm}, {r.placement}, {r.mode}, {r.num_gpus} GPUs", "metric", "value")
    head.add_row("step time (steady state)", fmt_s(r.step_time_s))
    head.add_row("work-depth lower bound", f"{fmt_s(r.bounds.lower_bound_s)}  (step / bound = {r.bounds.ratio:.2f}x)")
    head.add_row("tokens per step (trained)", f"{r.tokens_per_step:,.0f}")
    head.add_row("tokens/s  |  per GPU", f"{r.tokens_per_s:,.0f}  |  {r.tokens_per_s_per_gpu:,.1f}")
    head.add_row("rollout tail (last 10% of requests)", fmt_s(r.rollout_tail_s))
    if r.cost_usd_per_step is not None:
        head.add_row("cost per step", f"${r.cost_usd_per_step:,.2f}")
    if r.staleness:
        head.add_row("staleness (updates behind: share of responses)", r.staleness_distribution.summary())
    console.print(head)
    stages = table("stages (mean per step)", "stage", "pool", "time", "share", "work (GPU·s)", "depth", "W/D")
    total = sum(s.time_s for s in r.stages) or 1.0
    for s in r.stages:
        par = f"{s.work_s / s.depth_s:,.0f}" if s.depth_s > 0 else "-"
        stages.add_row(s.name, s.pool, fmt_s(s.time_s), f"{100 * s.time_s / total:.0f}%", f"{s.work_s:,.1f}", fmt_s(s.depth_s), par)
    console.print(stages)
    pools = table("pools", "pool", "GPUs", "utilization", "idle / step", "peak memory", "capacity")
    for p in r.pools:
        pools.add_row(p.name, str(p.num_gpus), f"{100 * p.utilization:.0f}%", fmt_s(p.idle_s_per_step),
                      fmt_bytes(p.peak_memory_bytes), fmt_bytes(p.capacity_bytes))
    console.print(pools)
    for n in r.notes:
        console.print(f"note: {n}")


@app.command("simulate")
def simulate_cmd(
    scenario: str = typer.Argument(..., help="scenario YAML file or shipped example name (see `rlperf scenarios`)"),
    out: str = typer.Option("out", "--out", help="folder for result.json and trace.json"),
    iterations: int = typer.Option(0, help="override simulation.iterations (0: keep)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON instead of tables"),
    force: bool = typer.Option(False, "--force", help="replace result and trace files that exist"),
) -> None:
    """Simulate several RL iterations of SCENARIO; write OUT/<name>.result.json and OUT/<name>.trace.json
    (<name>: the scenario's name made a safe file name)."""
    from rlperf.inputs.ranges import ITERATIONS, check_option
    from rlperf.outputs import claim, dumps_strict, output_folder, safe_name, write_text
    from rlperf.errors import SpecError
    from rlperf.scenario import load_scenario, scenario_path
    from rlperf.api import simulate
    from rlperf.sim.trace import write_chrome_trace
    from rlperf.specs.response_lengths import scenario_lengths

    if iterations:
        check_option("--iterations", iterations, ITERATIONS)
    folder = output_folder(out, "--out")  # the option's text: an empty one is refused, not read as "."
    sc = load_scenario(scenario)
    res_path = folder / f"{safe_name(sc.name)}.result.json"
    trace_path = folder / f"{safe_name(sc.name)}.trace.json"
    claim((res_path, trace_path), force, "--out")  # before the simulation, not after it
    try:
        r = simulate(sc, iterations or None)
    except SpecError as err:  # a plan the model cannot take (heads, layers, experts): the file's field
        raise (err.in_source(scenario_path(scenario)) if err.field.startswith("plan.") else err) from None
    text = dumps_strict(r.to_dict(), indent=1, sort_keys=True)
    write_text(res_path, text)
    write_chrome_trace(trace_path, r.segments, title=sc.name)
    if as_json:
        typer.echo(text)
        return
    console.print(question_line(sc))
    console.print(scenario_lengths(sc).describe(), markup=False, highlight=False)
    render_result(r)
    render_decode_step(sc)
    console.print(f"wrote {res_path} and {trace_path} (open the trace in https://ui.perfetto.dev)")


def render_decode_step(sc: object) -> None:
    """One representative rollout decode step, term by term with each term's source."""
    from rlperf.scenario import Scenario
    from rlperf.stages.rollout_breakdown import representative_step

    assert isinstance(sc, Scenario)
    bd = representative_step(sc)
    t = table(f"rollout decode step: {bd.num_decode} sequences per replica, {bd.context_tokens:,.0f} context tokens "
              f"(step {fmt_s(bd.step_s)}, {bd.bound}-bound)", "term", "time", "side", "source")
    for term in bd.terms:
        t.add_row(term.name, fmt_s(term.time_s), term.side, term.source)
    console.print(t)


@app.command("scenarios")
def scenarios_cmd() -> None:
    """List the shipped example scenarios."""
    import yaml

    from rlperf.scenario import list_scenarios

    t = table("example scenarios", "name", "description")
    base = Path(__file__).resolve().parent.parent / "scenarios"
    for name in list_scenarios():
        text = (base / f"{name}.yaml").read_text()
        first = text.splitlines()[0].lstrip("# ") if text.startswith("#") else ""
        yaml.safe_load(text)
        t.add_row(name, first)
    console.print(t)
