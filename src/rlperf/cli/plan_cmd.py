"""`rlperf plan`: find the best way to run the RL step on a cluster (the main job).

Built on :func:`rlperf.api.plan`; this module only parses flags and prints the answer.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer

from rlperf.api import DEFAULT_SCENARIO, PlanAnswer, RunTotals
from rlperf.cli.app import app, collector_paused
from rlperf.cli.render import console, fmt_bytes, fmt_range_end, fmt_s, progress_reporter, question_line, table
from rlperf.plan.memory_breakdown import RoleMemory
from rlperf.plan.search import PlanEvaluation, PlanSearchResult

RANKED_ROWS = 5


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
    r.check_jobs(jobs)


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
    max_response: int = typer.Option(None, help="response length cap (tokens)"),
    mean_response: float = typer.Option(None, help="mean response length in tokens, after truncation (default: cap/3)"),
    median_response: float = typer.Option(None, help="median response length in tokens, before truncation"),
    length_preset: str = typer.Option(None, help="response lengths of a published recipe (`rlperf workloads`)"),
    lengths: str = typer.Option(None, help="length sweep: the best plan at these mean response lengths, e.g. 2k,5k,8k"),
    steps: int = typer.Option(None, help="steps of the run: total hours, GPU-hours and cost"),
    end_mean_response: float = typer.Option(None, help="with --steps: mean response length at the last step (linear growth)"),
    framework: str = typer.Option(None, help="only plans this framework runs (verl, OpenRLHF, ...); prints its launch config"),
    objective: str = typer.Option("time", help="time | cost | throughput_per_gpu"),
    max_staleness: int = typer.Option(2, help="largest policy lag allowed (0 = on-policy only)"),
    top_k: int = typer.Option(3, help="plans per GPU count simulated after the fast estimate"),
    fine_splits: bool = typer.Option(False, "--fine-splits", help="split rollout:training at every node boundary (up to 8 nodes; slower)"),
    from_kind: str = typer.Option(None, "--from", help="import your plan from a framework config: verl | openrlhf"),
    config: str = typer.Argument(None, help="with --from: the framework config (verl YAML, or OpenRLHF args file)"),
    override: list[str] = typer.Option(None, "--override", "-o", help="with --from verl: key=value overrides"),
    set_: list[str] = typer.Option(None, "--set", help="with --from: NAME=VALUE for a variable the launch script reads"),
    model_config: str = typer.Option(None, "--model-config", help="the actor's config.json (or its folder): its shapes win over the catalog's; needed for an id the catalog does not know"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON (schema: docs/plan.schema.json)"),
    report: str = typer.Option(None, "--report", help="write a self-contained HTML report into this folder"),
    explain_: bool = typer.Option(False, "--explain", help="list rejected plans with their reasons"),
    executor: str = typer.Option("local", help="local (process pool over local cores) | ray"),
    jobs: int = typer.Option(0, help="worker processes for the local executor (0: all cores; none on 1-2 cores)"),
    hardware_profile: Path = typer.Option(None, "--hardware-profile", help="hardware profile file (e.g. from `rlperf calibrate`)"),
    force: bool = typer.Option(False, "--force", help="with --report: replace a report that exists"),
) -> None:
    """Search placements, parallel layouts and execution modes; print the best plan, its interval,
    the run's totals, its memory and the framework config to launch it."""
    from rlperf.api import plan
    from rlperf.errors import SpecError
    from rlperf.outputs import dumps_strict
    from rlperf.plan.search import local_mapper, ray_mapper
    from rlperf.plan.serialize import answer_json
    from rlperf.specs.response_lengths import parse_token_count

    for flag, text in (("--scenario", scenario), ("--model", model), ("--gpu", gpu), ("--algorithm", algorithm),
                       ("--workload", workload), ("--length-preset", length_preset), ("--lengths", lengths),
                       ("--framework", framework), ("--from", from_kind), ("config", config), ("--model-config", model_config)):
        if text is not None and not text.strip():  # read as "not given": the default answered, silently
            raise SpecError(flag, "is empty (an unset shell variable?)", "a value, or leave the option out")
    if executor not in ("local", "ray"):
        raise SpecError("--executor", f"unknown {executor!r}", "local, ray")
    check_plan_options(nodes, gpus_per_node, prompts, group_size, max_response, max_staleness, top_k, jobs)
    from rlperf.inputs import ranges

    ranges.check_option("--steps", steps, ranges.RUN_STEPS)
    if report is not None:  # refuse a bad target now, not after the search
        from rlperf.outputs import claim, output_folder
        from rlperf.report.html import REPORT_NAME

        claim([output_folder(report, "--report") / REPORT_NAME], force, "--report")
    elif force:  # it replaces only the report: alone it did nothing, silently
        raise SpecError("--force", "is read only with --report", "give --report FOLDER, or leave --force out")
    sweep = [parse_token_count(x, "--lengths") for x in lengths.split(",")] if lengths else []
    import_report = None
    resolved = None
    if not from_kind:  # each is read by the import only: without --from it would be ignored silently
        for flag, given in (("--override", override), ("--set", set_), ("--model-config", model_config), ("config", config)):
            if given:
                use = "give the config.json as --model" if flag == "--model-config" else "give --from verl|openrlhf"
                raise SpecError(flag, "is read only with --from", use)
    if from_kind:
        from rlperf.frameworks.load import KINDS

        if from_kind.lower() not in KINDS:
            raise SpecError("--from", f"unknown framework {from_kind!r}", ", ".join(KINDS))
        if not config:
            raise SpecError("--from", "needs the framework config as an argument")
        from rlperf.cli.frameworks_cmd import check_overrides, parse_env
        from rlperf.frameworks import load_framework_config
        from rlperf.scenario import resolve
        from rlperf.specs.response_lengths import LengthChoice

        # The config sets these: with --from they were ignored and the import answered, silently.
        for flag, value in (("--scenario", scenario), ("--model", model), ("--nodes", nodes),
                            ("--gpus-per-node", gpus_per_node), ("--algorithm", algorithm), ("--workload", workload),
                            ("--prompts", prompts), ("--group-size", group_size), ("--max-response", max_response),
                            ("--median-response", median_response), ("--length-preset", length_preset)):
            if value is not None:
                raise SpecError(flag, "is set by the framework config given with --from",
                                "change it in the config (verl: -o key=value; a script variable: --set NAME=VALUE)")
        check_overrides(from_kind, list(override or []), "-o")
        try:
            spec, import_report = load_framework_config(from_kind, config, list(override or []), env=parse_env(set_ or []),
                                                        model_config=model_config, gpu=gpu or "H100",
                                                        mean_response_tokens=mean_response)
        except SpecError as err:  # the import's name for the option, not this command's
            if err.field != "--mean-response-tokens":
                raise
            raise SpecError("--mean-response", err.problem, err.allowed) from None
        if hardware_profile is not None:  # framework configs name no hardware: the option's, as without --from
            spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"profile": str(hardware_profile)})})
        sc = resolve(spec)
        resolved = (sc, LengthChoice(sc.workload.response_length, f"{from_kind} import: " + "; ".join(
            a for a in import_report.assumptions if "response" in a) or f"{from_kind} import"))
    mapper = ray_mapper() if executor == "ray" else local_mapper(jobs or None)
    with collector_paused(), progress_reporter(console) as progress:
        ans = plan(scenario, end_mean_response=end_mean_response, steps=steps, lengths=sweep, framework=framework,
                   objective=objective, max_staleness=max_staleness, top_k=top_k, fine_splits=fine_splits,
                   resolved=resolved, mapper=mapper, timeline=report is not None,
                   progress=progress, model=model, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node,
                   algorithm=algorithm, workload=workload, prompts=prompts, group_size=group_size,
                   max_response=max_response, mean_response=mean_response, median_response=median_response,
                   length_preset=length_preset, hardware_profile=hardware_profile)
    if as_json:
        out = answer_json(ans)
        if import_report is not None:
            out["import_report"] = import_report.lines()
        typer.echo(dumps_strict(out, indent=1))
    else:
        render_answer(ans)
        if import_report is not None:
            console.print("[bold]import report[/] (how your config was read):")
            for line in import_report.lines():
                console.print(f"  {line}", markup=False)
        if explain_:
            render_rejected(ans.search)
    if report is not None:
        from rlperf.report.html import write_report

        path = write_report(Path(report), ans)
        if not as_json:
            console.print(f"report: {path}")


def render_answer(ans: PlanAnswer) -> None:
    sc, res, b = ans.question, ans.search, ans.best
    fw = f", plans {ans.framework} runs" if ans.framework else ""
    console.print(question_line(sc, fw))
    console.print(ans.lengths.describe(), markup=False, highlight=False)
    render_ranked(res)
    iv = ans.interval
    rng = f" ({iv.label} {fmt_range_end(iv.low_s)} - {fmt_range_end(iv.high_s)})" if not math.isnan(iv.low_s) else ""
    cost = f", ${b.cost_usd_per_step:,.2f}/step" if b.cost_usd_per_step is not None else ""
    console.print(f"[bold green]best:[/] {b.label} on {b.num_gpus} GPUs: {fmt_s(b.step_time_s)} per step{rng}{cost}")
    console.print(f"  [dim]range: {iv.describe()}[/]")
    for other in [*res.baselines, *([res.user] if res.user else [])]:
        who = "your plan" if other.source == "user" else other.label
        if other.sim is None:
            console.print(f"  vs {who}: infeasible: {other.error}", markup=False, highlight=False)
        else:
            console.print(f"  vs {who}: {fmt_s(other.step_time_s)} ({other.step_time_s / b.step_time_s:.2f}x)")
    if ans.run is not None:
        render_run(ans.run)
    if ans.sweep:
        console.print("length sweep (best plan): " + ", ".join(
            f"mean {p.mean_response_tokens:,.0f} -> {fmt_s(p.step_time_s)}"
            + (f" ${p.cost_usd_per_step:,.2f}" if p.cost_usd_per_step is not None else "") for p in ans.sweep))
    yours = ans.user_memory if ans.user_memory and res.user is not None and res.user.plan != b.plan else ()
    capacity = fmt_bytes(sc.cluster.accelerator.device_memory_bytes)
    render_memory(f"memory per GPU of {capacity} (what CUDA reports): worst case, micro-batches of sequences at the length cap "
                  "(decides the fit); at mean: of mean-length sequences",
                  (("best", ans.memory), ("yours", yours)))
    if ans.explanation is not None:
        gap = ans.explanation.bound_gap
        if gap is not None:
            console.print(f"[bold]distance to the bound:[/] {gap.headline()}", markup=True, highlight=False)
        console.print(f"[bold]best plan:[/] {ans.explanation.headline()}; what if (simulated):")
        for x in ans.explanation.what_ifs[:3]:
            got = (f"{fmt_s(x.step_time_s)} ({x.speedup:.2f}x, staleness {x.staleness_summary or x.staleness})"
                   + (f"; {x.note}" if x.note else "") if x.step_time_s != float("inf") else x.note[:90])
            console.print(f"  {x.change}: {got}", markup=False, highlight=False)
    if ans.launch is not None:
        console.print(f"[bold]launch with {ans.launch.framework}[/] (the best plan):")
        console.print(compact_command(ans.launch.prefix, ans.launch.args), markup=False, highlight=False, soft_wrap=True)
        for m in ans.launch.not_expressible:
            console.print(f"  not expressible: {m}", markup=False, highlight=False)
        for n in ans.launch.notes:
            console.print(f"  note: {n}", markup=False, highlight=False)
    elif ans.framework:
        console.print(f"[dim]rlperf writes no {ans.framework} config (export: verl, openrlhf)[/]")
    console.print("[dim]each plan is simulated for a few iterations (sync: 1 warm-up + 1); `rlperf simulate` and "
                  "`rlperf analyze` run a scenario's own iterations (other sampled batches), so their step time of "
                  "the same plan differs by that sampling[/]")
    console.print(f"[dim]{res.considered} candidates, {len(res.rejected)} rejected, {res.elapsed_s:.1f} s; "
                  + "; ".join(res.notes) + "[/]")


def render_ranked(res: PlanSearchResult) -> None:
    t = table("ranked plans (simulated; step = time per step of B·G trained responses)", "#", "placement", "rollout",
              "training", "mode", "GPUs", "step", "est.", "tok/s/GPU", "$/step", "stale", "bound")
    rows = sorted([e for e in (*res.evaluated, *res.baselines, *([res.user] if res.user else [])) if e.sim is not None],
                  key=lambda e: (e.step_time_s, e.label))
    seen: set[tuple[str, int]] = set()
    rank = 0
    for e in rows:
        key = (e.label, e.num_gpus)
        if key in seen:
            continue
        seen.add(key)
        rank += 1
        if rank > RANKED_ROWS and e.source == "search":
            continue
        assert e.sim is not None
        tag = {"baseline": " [dim](baseline)[/]", "user": " [cyan](yours)[/]"}.get(e.source, "")
        star = "[green]*[/] " if e is res.best else ""
        cost = f"{e.cost_usd_per_step:,.2f}" if e.cost_usd_per_step is not None else "-"
        est = fmt_s(e.estimate.step_time_s) if e.estimate else "-"
        parts = plan_columns(e)
        t.add_row(str(rank), star + parts[0] + tag, parts[1], parts[2], parts[3], str(e.num_gpus), fmt_s(e.step_time_s), est,
                  f"{e.sim.tokens_per_s_per_gpu:,.0f}", cost, str(e.staleness), fmt_s(e.sim.bounds.lower_bound_s))
    console.print(t)
    console.print("[dim]mbNk: token budget per training micro-batch (N x 1024 tokens); est.: the fast estimate "
                  "that ranked the candidates; bound: work-depth lower bound of the step[/]")


def render_run(run: RunTotals) -> None:
    iv = run.interval
    cost = f", ${run.cost_usd:,.0f}" if run.cost_usd is not None else ""
    rng = f" ({iv.label} {fmt_range_end(iv.low_s)} - {fmt_range_end(iv.high_s)})" if not math.isnan(iv.low_s) else ""
    console.print(f"[bold]run of {run.steps} steps:[/] {fmt_s(run.total_s)}{rng}, {run.gpu_hours:,.1f} GPU-hours on "
                  f"{run.num_gpus} GPUs{cost}")
    if len(run.points) > 1:
        console.print("  step time over the run: " + ", ".join(
            f"step {p.step + 1} (mean {p.mean_response_tokens:,.0f}) {fmt_s(p.step_time_s)}" for p in run.points))


MEMORY_COLUMNS = ("weights", "grads", "optimizer", "activations", "logits", "KV cache", "other", "device",
                  "at mean", "host RAM")


def memory_cells(r: RoleMemory) -> list[str]:
    vals = (r.weights_bytes, r.grads_bytes, r.optimizer_bytes, r.activations_bytes, r.logits_bytes, r.kv_cache_bytes,
            r.other_bytes, r.device_bytes, r.mean_device_bytes, r.host_bytes)
    return [fmt_bytes(v) if v else "-" for v in vals]


def render_memory(title: str, plans: tuple[tuple[str, tuple[RoleMemory, ...]], ...]) -> None:
    """One table, a section per plan (the best, then yours when it differs)."""
    t = table(title, "plan", "role (pass)", "pool", *MEMORY_COLUMNS)
    notes = []
    for name, rows in plans:
        if not rows:
            continue
        if t.row_count:
            t.add_section()
        for r in rows:
            cells = memory_cells(r)
            if r.note:
                cells = ["-"] * (len(cells) - 3) + ["does not fit", "-", cells[-1]]
                notes.append(f"  {name}: {r.role} ({r.work}): {r.note}")
            t.add_row(name, f"{r.role} ({r.work})", f"{r.pool} ({r.pool_gpus})", *cells)
    console.print(t)
    for n in notes:
        console.print(n, markup=False, highlight=False)


def render_rejected(res: PlanSearchResult) -> None:
    """Rejected candidates grouped by reason: one row per reason, with a count and an example."""
    from rlperf.report.html import rejected_groups

    t = table(f"rejected plans: {len(res.rejected)}, grouped by reason", "reason", "plans", "e.g.")
    for reason, n, example in rejected_groups(res):
        t.add_row(reason, str(n), example)
    console.print(t)
    if res.pruned:
        p = table("plans never simulated (branch and bound)", "plans", "why")
        for x in res.pruned:
            p.add_row(str(x.count), x.reason)
        console.print(p)


def plan_columns(e: PlanEvaluation) -> list[str]:
    """placement | rollout | training | mode of a plan (its label when the search wrote one)."""
    parts = e.label.split(" | ")
    if len(parts) == 4:
        return parts
    p = e.plan
    eng = f"gen tp{p.rollout.tp}" + (f" ep{p.rollout.ep}" if p.rollout.ep > 1 else "")
    lay = p.layouts["actor"]
    mb = f" mb{lay.max_tokens_per_microbatch // 1024}k" if lay.max_tokens_per_microbatch else ""
    from rlperf.modes import mode_of

    mode = mode_of(p.mode).label
    return [e.label, eng, f"train tp{lay.tp} pp{lay.pp} cp{lay.cp}{mb}", mode]


def compact_command(prefix: tuple[str, ...], args: tuple[str, ...], width: int = 150) -> str:
    """One shell command, arguments packed into lines of at most ``width`` characters."""
    import shlex

    lines: list[str] = [" ".join(prefix)]
    for arg in args:
        word = shlex.quote(arg)
        if len(lines[-1]) + 1 + len(word) > width and lines[-1]:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return " \\\n  ".join(lines)
