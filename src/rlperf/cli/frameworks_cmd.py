"""`rlperf frameworks`, `rlperf compare`, `rlperf import`, `rlperf export`: speak the frameworks' language."""

from __future__ import annotations

from rlperf.modes import mode_of

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rlperf.cli.app import app
from rlperf.cli.render import console, fmt_s, table
from rlperf.errors import SpecError, show_path

if TYPE_CHECKING:
    from rlperf.frameworks.presets import FrameworkPreset
    from rlperf.specs.plan import Plan


@app.command("frameworks")
def frameworks_cmd(
    name: str = typer.Argument(None, help="one framework to describe (default: the support matrix of all)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """The support matrix: which strategies of the taxonomy each framework supports."""
    from rlperf.frameworks.presets import LEGEND, MARKS, STRATEGY_GROUPS, STRATEGY_TITLES, get_framework, list_frameworks

    if name is not None and not name.strip():
        raise SpecError("framework", "is empty (an unset shell variable?)", "a framework name, or leave it out")
    presets = [get_framework(name)] if name else list_frameworks()
    if as_json:
        data = [{"name": p.name, "support": {s: {"level": v.level, "note": v.note} for s, v in p.support}} for p in presets]
        typer.echo(json.dumps(data, indent=1))
        return
    if name:
        _describe(presets[0])
        return
    for group, strategies in STRATEGY_GROUPS:
        t = table(f"support matrix: {group}", "framework", *(STRATEGY_TITLES[s] for s in strategies))
        for p in presets:
            t.add_row(p.name, *(MARKS[p.supports(s).level] for s in strategies))
        console.print(t)
    console.print(f"{LEGEND}. Source: frameworks_overview.md §1; `rlperf frameworks NAME` gives the notes.")


def _describe(p: FrameworkPreset) -> None:
    from rlperf.frameworks.presets import MARKS, STRATEGY_GROUPS, STRATEGY_TITLES

    from rich.markup import escape

    head = table(escape(f"{p.name}: {p.summary}"), "field", "value")
    d = p.defaults
    rows = [
        ("training backends", ", ".join(p.training_backends)),
        ("rollout engines", ", ".join(p.rollout_engines)),
        ("weight sync", p.weight_sync),
        ("algorithms (in rlperf)", ", ".join(p.algorithms)),
        ("default plan", f"{d.placement}, {d.mode}{' + fusion' if d.fusion else ''}, {d.backend}"),
        ("defaults from", d.source),
        *(("assumed", a) for a in d.assumed),
        ("sources", ", ".join(f"[{s}]" for s in p.sources) + " (frameworks_overview.md §7)"),
    ]
    for field, value in rows:
        head.add_row(field, escape(value))
    for column in head.columns:
        column.justify = "left"
    console.print(head)
    t = table("strategies", "group", "strategy", "support", "note")
    for group, strategies in STRATEGY_GROUPS:
        for s in strategies:
            v = p.supports(s)
            t.add_row(group, STRATEGY_TITLES[s], MARKS[v.level], escape(v.note))
    for column in t.columns:
        column.justify = "left"
    console.print(t)


def describe_plan(plan: Plan) -> str:
    """One line: placement, engine, training layout and mode."""
    lay, e, m = plan.layout_for("actor"), plan.rollout, plan.mode
    where = plan.placement.kind + (f" ({plan.placement.rollout_gpus} gen)" if plan.placement.rollout_gpus else "")
    train = f"tp{lay.tp} pp{lay.pp} cp{lay.cp} ZeRO-{lay.zero_stage}"
    mode = mode_of(m).label
    return f"{where}; engine tp{e.tp}; train {train}; {mode}"


@app.command("compare")
def compare_cmd(
    scenario: str = typer.Argument(..., help="scenario YAML file or shipped example name"),
    frameworks: str = typer.Option("", "--frameworks", help="comma-separated names (default: all)"),
    iterations: int = typer.Option(0, help="override simulation.iterations (0: keep)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """Simulate SCENARIO's workload on its cluster as each framework would run it by default."""
    from rlperf.frameworks.compare import compare_frameworks
    from rlperf.inputs.ranges import ITERATIONS, check_option
    from rlperf.scenario import load_scenario_spec

    if iterations:  # 0 keeps the scenario's; anything else in simulate's range, checked before the work
        check_option("--iterations", iterations, ITERATIONS)
    spec = load_scenario_spec(scenario)
    if iterations:
        sim = spec.simulation.model_copy(update={"iterations": iterations, "warmup": min(spec.simulation.warmup, iterations - 1)})
        spec = spec.model_copy(update={"simulation": sim})
    names = [n.strip() for n in frameworks.split(",") if n.strip()] or None
    runs = compare_frameworks(spec, names)
    if as_json:
        rows = [
            {
                "framework": r.framework,
                "plan": r.plan.model_dump(mode="json") if r.plan else None,
                "step_time_s": r.result.step_time_s if r.result else None,
                "tokens_per_s_per_gpu": r.result.tokens_per_s_per_gpu if r.result else None,
                "longest_stage": r.longest_stage,
                "reason": r.reason,
                "notes": list(r.notes),
            }
            for r in runs
        ]
        typer.echo(json.dumps(rows, indent=1))
        return
    t = table(f"{spec.name}: {spec.algorithm.name} on {spec.cluster.num_nodes} x {spec.cluster.gpu} nodes, each framework's default plan",
              "framework", "step time", "tokens/s/GPU", "longest stage", "plan / why not")
    for r in runs:
        if r.result is None:
            t.add_row(r.framework, "-", "-", "-", r.reason or "")
        else:
            assert r.plan is not None
            t.add_row(r.framework, fmt_s(r.result.step_time_s), f"{r.result.tokens_per_s_per_gpu:,.1f}", r.longest_stage or "-", describe_plan(r.plan))
    console.print(t)


@app.command("import")
def import_cmd(
    kind: str = typer.Argument(..., help="verl or openrlhf"),
    config: str = typer.Argument(..., help="a launch script (*.sh); verl: a YAML or overrides file; OpenRLHF: a file holding the command line"),
    overrides: list[str] = typer.Argument(None, help="verl: Hydra overrides (key=value); OpenRLHF: more arguments after `--`"),
    set_: list[str] = typer.Option(None, "--set", help="NAME=VALUE: a variable the launch script reads from its environment"),
    model_config: str = typer.Option(None, "--model-config", help="the actor's config.json (or its folder): its shapes win over the catalog's; needed for an id the catalog does not know"),
    gpu: str = typer.Option("H100", help="accelerator (framework configs do not name it)"),
    mean_response_tokens: float = typer.Option(0.0, help="mean response length if known (0: cap/3)"),
    out_: str = typer.Option(None, "--out", help="write the scenario YAML here"),
    force: bool = typer.Option(False, "--force", help="replace --out if it exists"),
) -> None:
    """Import a verl config or an OpenRLHF command line as an rlperf scenario; list every key not mapped."""
    import yaml
    from rich.markup import escape

    from rlperf.frameworks.load import load_framework_config
    from rlperf.outputs import claim, write_text

    from rlperf.frameworks.load import KINDS

    for flag, text in (("--out", out_), ("--model-config", model_config), ("--gpu", gpu)):
        if text is not None and not text.strip():  # a Path("") would be '.', the current folder
            raise SpecError(flag, "is empty (an unset shell variable?)", "a value, or leave the option out")
    if kind.lower() not in KINDS:  # this command's argument, not the library's field name
        raise SpecError("kind", f"unknown framework {kind!r}", ", ".join(KINDS))
    check_overrides(kind, overrides or [], "overrides")
    out = Path(out_) if out_ is not None else None
    if out is not None:
        claim([out], force, "--out")  # writable: a file made and removed in its folder, now
    from rlperf.specs.hardware_catalog import load_accelerator

    try:  # an unknown name here was written into the scenario, refused only on its use
        load_accelerator(gpu)
    except SpecError as err:
        raise SpecError("--gpu", err.problem, err.allowed) from None

    spec, report = load_framework_config(
        kind, config, overrides or [], gpu=gpu, mean_response_tokens=mean_response_tokens or None, env=parse_env(set_ or []), model_config=model_config
    )
    for w in report.warnings:
        console.print(f"script: {escape(w)}", style="yellow")
    for title, notes, style in (
        ("unknown keys (not recognised, not used)", report.unknown, "bold red"),
        ("unsupported keys (affect performance, not modelled)", report.unsupported, "yellow"),
    ):
        if notes:
            t = table(title, "key", "value", "note")
            for column in t.columns:
                column.justify, column.overflow = "left", "fold"
            for n in notes:
                t.add_row(escape(n.key), escape(n.value), escape(n.note), style=style)
            console.print(t)
    console.print(f"mapped {len(report.mapped)}, defaulted {len(report.defaulted)}, ignored by design {len(report.ignored)} keys")
    for a in report.assumptions:
        console.print(f"assumed: {escape(a)}")
    text = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    if out is None:
        typer.echo(text)
    else:
        try:
            write_text(out, text)
        except OSError as err:  # e.g. the disk filled since claim's probe: the path given, not the temporary file's
            raise SpecError("--out", f"cannot write {show_path(out)!r} ({err.strerror or type(err).__name__})") from None
        console.print(f"wrote {out}")


def check_overrides(kind: str, items: list[str], option: str) -> None:
    """Refuse overrides that would do nothing or set a key named '' (checked before the import):
    an empty one (an unset shell variable?) and, for verl, one that is not a Hydra override.
    OpenRLHF's are more arguments, any word."""
    from rlperf.frameworks.config_tree import OVERRIDE_FORMS, check_override

    if kind.lower() != "verl":
        return
    for item in items:
        if not item.strip():
            raise SpecError(option, "is empty (an unset shell variable?)", f"{OVERRIDE_FORMS}, or leave it out")
        check_override(item, option)


def parse_env(items: list[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` options as an environment."""
    env: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise SpecError("--set", f"{item!r} is not NAME=VALUE")
        env[name] = value
    return env


@app.command("export")
def export_cmd(
    scenario: str = typer.Argument(..., help="scenario YAML file or shipped example name"),
    to: str = typer.Option(..., "--to", help="verl or openrlhf"),
) -> None:
    """Say SCENARIO's plan as verl overrides or an OpenRLHF command line; list what cannot be said."""
    from rlperf.frameworks.common import check_runnable
    from rlperf.frameworks.openrlhf_export import export_openrlhf
    from rlperf.frameworks.verl_export import export_verl
    from rlperf.scenario import load_scenario, scenario_path

    exporters = {"verl": export_verl, "openrlhf": export_openrlhf}
    if to.lower() not in exporters:
        raise SpecError("--to", f"unknown framework {to!r}", ", ".join(exporters))
    sc = load_scenario(scenario)
    try:  # a plan `rlperf simulate` refuses would be written as a config that cannot run
        check_runnable(sc)
    except SpecError as err:  # as simulate names it: the file's field
        raise (err.in_source(scenario_path(scenario)) if err.field.startswith("plan.") else err) from None
    result = exporters[to.lower()](sc)
    typer.echo(result.command_line())
    for n in result.notes:
        console.print(f"note: {n}")
    for m in result.not_expressible:
        console.print(f"not expressible: {m}", style="yellow")
