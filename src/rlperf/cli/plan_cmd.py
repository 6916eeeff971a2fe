"""`rlperf plan`: find the best way to run the RL step on a cluster (the main job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, fmt_bytes, fmt_s, table

DEFAULT_SCENARIO = "grpo-qwen2.5-7b-colocated-sync"


def build_scenario(
    scenario: str | None,
    model: str | None,
    gpu: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    algorithm: str | None,
    workload: str | None,
    prompts: int | None,
    group_size: int | None,
    max_response: int | None,
    hardware_profile: Path | None,
) -> Any:
    """The scenario to plan: a file/example (default: the embedded one) with CLI overrides."""
    from rlperf.scenario import load_scenario, read_scenario_data, scenario_path

    path = scenario_path(scenario or DEFAULT_SCENARIO)
    data = read_scenario_data(path)
    if model:
        data["model"] = model
    cl = dict(data.get("cluster") or {})
    if gpu:
        cl["gpu"] = gpu
    if nodes is not None:
        cl["num_nodes"] = nodes
    if gpus_per_node is not None:
        cl["gpus_per_node"] = gpus_per_node
    if hardware_profile:
        cl["profile"] = str(hardware_profile)
    data["cluster"] = cl
    if algorithm:
        data["algorithm"] = {**dict(data.get("algorithm") or {}), "name": algorithm, "minibatches": None}
    wl = dict(data.get("workload") or {})
    if workload:
        wl = {"preset": workload}
    if prompts is not None:
        wl["prompts_per_step"] = prompts
    if group_size is not None:
        wl["group_size"] = group_size
    if max_response is not None:
        if "preset" in wl:
            from rlperf.specs.workload_presets import load_workload_preset

            w = load_workload_preset(str(wl.pop("preset")), **{k: v for k, v in wl.items()})
            wl = w.model_dump(mode="json")
        rl = dict(wl["response_length"])
        if rl.get("kind") != "lognormal":
            from rlperf.errors import SpecError

            raise SpecError("--max-response", f"rescales log-normal response lengths; the workload's are {rl.get('kind')!r}",
                            "a scenario whose workload sets the cap itself")
        # Rescale the whole distribution (median x new cap / old cap): the shape, and so the share
        # of responses truncated at the cap, stays the scenario's.
        rl["median_tokens"] = float(rl["median_tokens"]) * max_response / float(rl["cap_tokens"])
        rl["cap_tokens"] = max_response
        wl["response_length"] = rl
    data["workload"] = wl
    return load_scenario(data)


def check_plan_options(nodes: int | None, gpus_per_node: int | None, prompts: int | None, group_size: int | None,
                       max_response: int | None, max_staleness: int, top_k: int, jobs: int) -> None:
    """Refuse numbers outside their physical range (0 nodes is an error, not "keep the scenario's")."""
    from rlperf.errors import SpecError
    from rlperf.inputs import ranges as r

    r.check_option("--nodes", nodes, r.NODES)
    r.check_option("--gpus-per-node", gpus_per_node, r.GPUS_PER_NODE)
    r.check_option("--prompts", prompts, r.PROMPTS)
    r.check_option("--group-size", group_size, r.GROUP_SIZE)
    r.check_option("--max-response", max_response, r.TOKENS)
    r.check_option("--max-staleness", max_staleness, r.STALENESS)
    if not 1 <= top_k <= 1_000:
        raise SpecError("--top-k", f"{top_k} is outside the useful range", "1 to 1,000 plans")
    if not 0 <= jobs <= 4_096:
        raise SpecError("--jobs", f"{jobs} is outside the useful range", "0 (all cores) to 4,096")


@app.command("plan")
def plan_cmd(
    scenario: str = typer.Option(None, "--scenario", "-s", help=f"scenario file or example name (default: {DEFAULT_SCENARIO})"),
    model: str = typer.Option(None, help="model (catalog name or config.json path)"),
    gpu: str = typer.Option(None, help="accelerator, e.g. H100, A100, H200"),
    nodes: int = typer.Option(None, help="number of nodes"),
    gpus_per_node: int = typer.Option(None, help="GPUs per node"),
    algorithm: str = typer.Option(None, help="GRPO, PPO, DAPO, ..."),
    workload: str = typer.Option(None, help="workload preset (see `rlperf workloads`)"),
    prompts: int = typer.Option(None, help="prompts per step"),
    group_size: int = typer.Option(None, help="responses per prompt"),
    max_response: int = typer.Option(None, help="response length cap (tokens); rescales the length distribution to it"),
    objective: str = typer.Option("time", help="time | cost | throughput_per_gpu"),
    max_staleness: int = typer.Option(2, help="largest policy lag allowed (0 = on-policy only)"),
    top_k: int = typer.Option(3, help="plans per GPU count simulated after the fast estimate"),
    from_kind: str = typer.Option(None, "--from", help="import your plan from a framework config: verl | openrlhf"),
    config: str = typer.Argument(None, help="with --from: the framework config (verl YAML, or OpenRLHF args file)"),
    override: list[str] = typer.Option(None, "--override", "-o", help="with --from verl: key=value overrides"),
    set_: list[str] = typer.Option(None, "--set", help="with --from: NAME=VALUE for a variable the launch script reads"),
    model_config: str = typer.Option(None, "--model-config", help="config.json (or its folder) for a model id the catalog does not know"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON (schema: docs/plan.schema.json)"),
    report: Path = typer.Option(None, "--report", help="write a self-contained HTML report into this folder"),
    explain_: bool = typer.Option(False, "--explain", help="list rejected plans with their reasons"),
    executor: str = typer.Option("local", help="local (process pool over local cores) | ray"),
    jobs: int = typer.Option(0, help="worker processes for the local executor (0: all cores)"),
    hardware_profile: Path = typer.Option(None, "--hardware-profile", help="hardware profile file (e.g. from `rlperf calibrate`)"),
    force: bool = typer.Option(False, "--force", help="replace a report that exists"),
) -> None:
    """Search placements, parallel layouts and execution modes; print the ranked plans."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from rlperf.errors import SpecError
    from rlperf.outputs import dumps_strict
    from rlperf.plan.explain import explain, simulate_plans
    from rlperf.plan.search import local_mapper, ray_mapper, search
    from rlperf.plan.serialize import search_json
    from rlperf.plan.space import SearchOptions

    if objective not in ("time", "cost", "throughput_per_gpu"):
        raise SpecError("--objective", f"unknown {objective!r}", "time, cost, throughput_per_gpu")
    if executor not in ("local", "ray"):
        raise SpecError("--executor", f"unknown {executor!r}", "local, ray")
    check_plan_options(nodes, gpus_per_node, prompts, group_size, max_response, max_staleness, top_k, jobs)
    if report is not None:  # refuse a bad target now, not after the search
        from rlperf.outputs import claim, output_folder
        from rlperf.report.html import REPORT_NAME

        claim([output_folder(report, "--report") / REPORT_NAME], force, "--report")
    import_report = None
    if from_kind:
        if not config:
            raise SpecError("--from", "needs the framework config as an argument")
        from rlperf.frameworks import load_framework_config
        from rlperf.scenario import resolve

        from rlperf.cli.frameworks_cmd import parse_env

        spec, import_report = load_framework_config(from_kind, config, list(override or []), env=parse_env(set_ or []), model_config=model_config)
        sc = resolve(spec)
    else:
        sc = build_scenario(scenario, model, gpu, nodes, gpus_per_node, algorithm, workload, prompts,
                            group_size, max_response, hardware_profile)
    opts = SearchOptions(max_staleness=max_staleness, top_k=top_k, objective=objective)
    mapper = ray_mapper() if executor == "ray" else local_mapper(jobs or None)
    if as_json:
        res = search(sc, opts, mapper)
    else:
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("planning", total=1)

            def progress(what: str, done: int, total: int) -> None:
                bar.update(task, description=what, completed=done, total=max(total, 1))

            res = search(sc, opts, mapper, progress)
    explanation = None
    target = res.user if (res.user is not None and res.user.sim is not None) else res.best
    if target.sim is not None:
        explanation = explain(sc.with_plan(target.plan) if target.num_gpus == sc.cluster.num_gpus else sc,
                              target.sim, lambda items: simulate_plans(items, mapper))
    if as_json:
        out = search_json(res, explanation)
        if import_report is not None:
            out["import_report"] = import_report.lines()
        typer.echo(dumps_strict(out, indent=1))
    else:
        render_search(res, explanation, sc)
        if import_report is not None:
            console.print("[bold]import report[/] (how your config was read):")
            for line in import_report.lines():
                console.print(f"  {line}", markup=False)
        if explain_:
            render_rejected(res)
    if report is not None:
        from rlperf.report.html import write_report

        path = write_report(report, sc, res, explanation)
        if not as_json:
            console.print(f"report: {path}")


def render_search(res: Any, explanation: Any, sc: Any) -> None:
    wl = sc.workload
    console.print(
        f"[bold]{sc.algorithm.name}[/] on [bold]{sc.models['actor'].name}[/], {sc.cluster.num_nodes}x{sc.cluster.gpus_per_node} "
        f"{sc.cluster.accelerator.id}, {wl.prompts_per_step} prompts x {wl.group_size}, max response {wl.max_response_tokens:,}"
    )
    t = table("ranked plans (simulated; step = time per step of B·G trained responses)", "#", "placement", "rollout",
              "training", "mode", "GPUs", "step", "est.", "tok/s/GPU", "$/step", "stale", "bound")
    rows = sorted(list(res.evaluated) + list(res.baselines) + ([res.user] if res.user else []),
                  key=lambda e: (e.step_time_s, e.label))
    seen: set[tuple[str, int]] = set()
    rank = 0
    for e in rows:
        key = (e.label, e.num_gpus)
        if key in seen or e.sim is None:
            continue
        seen.add(key)
        rank += 1
        tag = {"baseline": " [dim](baseline)[/]", "user": " [cyan](yours)[/]"}.get(e.source, "")
        star = "[green]*[/] " if e is res.best else ""
        cost = f"{e.cost_usd_per_step:,.2f}" if e.cost_usd_per_step is not None else "-"
        est = fmt_s(e.estimate.step_time_s) if e.estimate else "-"
        parts = e.label.split(" | ")
        if len(parts) != 4:
            parts = [e.label, _engine(e.plan), _layout(e.plan), _mode(e.plan)]
        t.add_row(str(rank), star + parts[0] + tag, parts[1], parts[2], parts[3], str(e.num_gpus), fmt_s(e.step_time_s), est,
                  f"{e.sim.tokens_per_s_per_gpu:,.0f}", cost, str(e.staleness), fmt_s(e.sim.bounds.lower_bound_s))
        if rank >= 15:
            break
    console.print(t)
    b = res.best
    console.print(f"[bold green]best:[/] {b.label} on {b.num_gpus} GPUs: {fmt_s(b.step_time_s)} per step")
    for base in res.baselines:
        if base.sim is not None:
            console.print(f"  vs {base.label}: {fmt_s(base.step_time_s)} ({base.step_time_s / b.step_time_s:.2f}x slower)")
    if res.user is not None and res.user.sim is not None:
        console.print(f"  vs your plan: {fmt_s(res.user.step_time_s)} ({res.user.step_time_s / b.step_time_s:.2f}x)")
    if b.sim is not None:
        mem = table("memory per GPU of the best plan", "pool", "GPUs", "peak", "capacity")
        for p in b.sim.pools:
            mem.add_row(p.name, str(p.num_gpus), fmt_bytes(p.peak_memory_bytes), fmt_bytes(p.capacity_bytes))
        console.print(mem)
    if explanation is not None:
        who = "your plan" if res.user is not None and res.user.sim is not None else "the best plan"
        console.print(f"[bold]{who}:[/] {explanation.headline()}")
        w = table("what if (simulated)", "change", "step", "speedup", "staleness")
        for x in explanation.what_ifs[:8]:
            w.add_row(x.change, fmt_s(x.step_time_s) if x.step_time_s != float("inf") else x.note[:60],
                      f"{x.speedup:.2f}x", str(x.staleness))
        console.print(w)
    console.print(f"[dim]{res.considered} candidates, {len(res.rejected)} rejected, {res.elapsed_s:.1f} s; "
                  + "; ".join(res.notes) + "[/]")


def render_rejected(res: Any) -> None:
    t = table("rejected plans (reason)", "plan", "reason")
    for r in res.rejected[:60]:
        t.add_row(r.label, r.reason)
    console.print(t)
    if res.pruned:
        p = table("plans never simulated (branch and bound)", "plans", "why")
        for x in res.pruned:
            p.add_row(str(x.count), x.reason)
        console.print(p)


def _engine(plan: Any) -> str:
    return f"gen tp{plan.rollout.tp}" + (f" ep{plan.rollout.ep}" if plan.rollout.ep > 1 else "")


def _layout(plan: Any) -> str:
    lay = plan.layouts["actor"]
    mb = f" mb{lay.max_tokens_per_microbatch // 1024}k" if lay.max_tokens_per_microbatch else ""
    return f"train tp{lay.tp} pp{lay.pp} cp{lay.cp}{mb}"


def _mode(plan: Any) -> str:
    m = plan.mode
    return {"sync": "sync", "one_step_off": "one-step-off", "async": f"async s={m.staleness}",
            "partial_rollout": f"partial {m.token_budget}"}[m.kind] + ("+fusion" if m.fusion else "")
