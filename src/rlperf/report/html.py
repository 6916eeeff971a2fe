"""The planner's report: one self-contained HTML file (plotly.js inline once, no network to open it;
the basic bundle of src/rlperf/report/vendor keeps the page near 1.3 MB instead of 5).

Sections: the scenario and the best plan against the framework baselines and the user's plan;
the ranked plans; a timeline of the best plan; the stage breakdown per plan; memory per pool
against capacity; the Pareto scatter; the work-depth table (numbers, then the symbolic
taxonomy); the explanation; the rejected plans with their reasons; the inputs, for
reproducibility. Tables are plain HTML; every text is escaped.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

from rlperf.cli.render import fmt_bytes, fmt_range_end, fmt_s
from rlperf.errors import SpecError
from rlperf.plan.memory_breakdown import RoleMemory
from rlperf.plan.explain import Explanation
from rlperf.plan.search import PlanEvaluation, PlanSearchResult
from rlperf.scenario import Scenario
from rlperf.workdepth import STAGES, STRATEGIES, SymbolicRow

if TYPE_CHECKING:
    from rlperf.api import PlanAnswer

REPORT_NAME = "plan-report.html"
MAX_STAGE_PLANS = 24  # bars of the stage breakdown (the fastest plans, plus baselines and yours)
MAX_REJECTED = 50

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1320px;
       padding: 16px 24px 48px; color: #1b1f24; background: #fff; }
h1 { font-size: 1.6em; margin: 0.4em 0 0.2em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1.05em; margin-top: 1.2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.88em; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; vertical-align: top; }
th { background: #f3f5f7; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.best td { background: #fff8c5; } tr.user td { background: #ddf4ff; }
.facts td:first-child { font-weight: 600; background: #f6f8fa; }
.caption, .muted { color: #57606a; font-size: 0.88em; }
.headline { font-size: 1.05em; padding: 8px 12px; background: #f6f8fa; border-left: 4px solid #0969da; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 0.8em; }
nav a { margin-right: 12px; font-size: 0.9em; }
"""


def write_report(out_dir: Path, ans: PlanAnswer) -> Path:
    """Write ``out_dir/plan-report.html`` and return its path."""
    from rlperf.outputs import write_text

    return write_text(Path(out_dir) / REPORT_NAME, render_report(ans))  # atomic: never half a report


def report_title(sc: Scenario) -> str:
    """The user's question, named by its algorithm, model and cluster (not the base file's name)."""
    c = sc.cluster
    return f"rlperf plan: {sc.algorithm.name} on {sc.models['actor'].name}, {c.num_nodes} x {c.gpus_per_node} {c.accelerator.id}"


def render_report(ans: PlanAnswer) -> str:
    try:
        from plotly.offline import get_plotlyjs

        from rlperf.report import figures as fg
    except ImportError:
        raise SpecError("--report", "the HTML report needs plotly", "pip install 'rlperf[report]'") from None
    sc, res, explanation = ans.question, ans.search, ans.explanation
    plans = simulated_plans(res)
    names = [plan_name(e, res) for e in plans]
    colors = fg.StageColors()
    best = res.best
    parts: list[str] = [_header(ans), _ranked(plans, names, res), _memory_table(ans)]
    if ans.launch is not None:
        parts.append(_launch(ans))
    if ans.run is not None:
        r = ans.run
        fig = fg.run_figure(r.step_times_s, [(p.step, p.mean_response_tokens, p.step_time_s) for p in r.points])
        parts.append(_section("run", f"The run: {r.steps} steps of the best plan", _div(fig, "fig-run"),
                              f"{r.hours:,.1f} h, {r.gpu_hours:,.0f} GPU-hours on {r.num_gpus} GPUs"
                              + (f", {r.cost_usd:,.0f} USD" if r.cost_usd is not None else "")
                              + ". Red: the simulated means; the curve interpolates linearly in the mean between them."))
    if best.sim is not None:
        # The best plan's stages take the first colors, so they match across figures.
        for st in best.sim.stages:
            colors(st.name)
        fig, caption = fg.timeline_figure(best.sim, colors)
        parts.append(_section("timeline", "Timeline of the best plan", _div(fig, "fig-timeline"), caption))
    stage_plans = _stage_plans(plans, res)
    stage_names = [names[plans.index(e)] for e in stage_plans]
    parts.append(_section(
        "stages", "Stage breakdown per plan", _div(fg.stage_breakdown_figure(stage_plans, stage_names, colors), "fig-stages"),
        "Mean time of each stage per steady-state step; the diamond is the step time. Stages on different pools, or "
        "overlapped by asynchronous execution, stack up to more than the step."))
    mem_plans = [e for e in plans if e is best or e.source in ("baseline", "user")]
    parts.append(_section(
        "memory", "Memory per pool against capacity", _div(fg.memory_figure(mem_plans, [names[plans.index(e)] for e in mem_plans]), "fig-memory"),
        "Peak memory per GPU of each pool in the simulated step (red: above capacity); black ticks: the GPU's HBM capacity."))
    pfig, ylabel = fg.pareto_figure(plans, names, res.pareto, best)
    parts.append(_section(
        "pareto", "Pareto front", _div(pfig, "fig-pareto"),
        f"Every simulated plan: step time against {ylabel}; marker area by GPUs, color by staleness. Ringed: the Pareto "
        "front over (step time, GPUs, cost per step, staleness), all minimized."))
    parts.append(_workdepth(plans, names, res))
    parts.append(_explanation(explanation))
    parts.append(_rejected(res))
    parts.append(_inputs(sc, res))
    title = report_title(sc)
    nav = "".join(f'<a href="#{k}">{html.escape(v)}</a>' for k, v in (
        ("summary", "summary"), ("ranked", "ranked plans"), ("breakdown", "memory breakdown"), ("launch", "launch"), ("run", "run"),
        ("timeline", "timeline"), ("stages", "stages"), ("memory", "memory"),
        ("pareto", "Pareto"), ("workdepth", "work-depth"), ("explanation", "explanation"), ("rejected", "rejected"),
        ("inputs", "inputs")))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n"
        f"<script>{plotly_bundle(get_plotlyjs)}</script>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<nav>{nav}</nav>\n" + "\n".join(parts) + "\n</body>\n</html>\n"
    )


def plotly_bundle(full: Callable[[], str]) -> str:
    """plotly.js to inline: the vendored basic bundle (scatter and bar, the report's traces) when
    it has the major version the Python plotly package writes figures for, else the full bundle."""
    import gzip
    from importlib import resources

    from plotly.offline import get_plotlyjs_version

    major = get_plotlyjs_version().split(".")[0]
    for f in (resources.files("rlperf") / "report" / "vendor").iterdir():
        if f.name.startswith(f"plotly-basic-{major}.") and f.name.endswith(".min.js.gz"):
            return gzip.decompress(f.read_bytes()).decode("utf-8")
    return full()


# --- plans ---------------------------------------------------------------------------------


def simulated_plans(res: PlanSearchResult) -> list[PlanEvaluation]:
    """Every simulated plan once: the best first, the rest by step time."""
    rest = sorted([*res.baselines, *([res.user] if res.user is not None else []), *res.evaluated],
                  key=lambda e: (e.step_time_s, e.label))
    seen: set[tuple[str, int, str]] = set()
    out: list[PlanEvaluation] = []
    for e in [res.best, *rest]:
        key = (e.label, e.num_gpus, e.source)
        if e.sim is None or key in seen:
            continue
        seen.add(key)
        out.append(e)
    return out


def plan_name(e: PlanEvaluation, res: PlanSearchResult) -> str:
    tag = {"baseline": " (baseline)", "user": " (yours)"}.get(e.source, "")
    star = "★ " if e is res.best else ""
    return f"{star}{e.label} @ {e.num_gpus} GPUs{tag}"


def _stage_plans(plans: Sequence[PlanEvaluation], res: PlanSearchResult) -> list[PlanEvaluation]:
    must = [e for e in plans if e is res.best or e.source in ("baseline", "user")]
    rest = [e for e in plans if e not in must][: max(MAX_STAGE_PLANS - len(must), 0)]
    return sorted(must + rest, key=lambda e: (e is not res.best, e.step_time_s, e.label))


# --- HTML helpers --------------------------------------------------------------------------


def _div(fig: Any, div_id: str) -> str:
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True}))


def _section(anchor: str, title: str, body: str, caption: str = "") -> str:
    cap = f'<p class="caption">{html.escape(caption)}</p>' if caption else ""
    return f'<section id="{anchor}">\n<h2>{html.escape(title)}</h2>\n{cap}\n{body}\n</section>'


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = (),
          row_classes: Sequence[str] | None = None, css: str = "") -> str:
    """A plain HTML table; every cell is escaped; columns in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="num">{html.escape(c)}</td>' if j in numeric else f"<td>{html.escape(c)}</td>"
                        for j, c in enumerate(r))
        body.append(f"<tr{cls}>{cells}</tr>")
    klass = f' class="{css}"' if css else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _usd(v: float | None) -> str:
    return f"{v:,.2f}" if v is not None else "-"


def _x(v: float) -> str:
    return f"{v:.2f}x" if math.isfinite(v) else "-"


# --- sections ------------------------------------------------------------------------------


def _header(ans: PlanAnswer) -> str:
    sc, res = ans.question, ans.search
    wl = sc.workload
    cl = sc.cluster
    price = cl.accelerator.price_usd_per_hour
    iv = ans.interval
    facts = [
        ("question", f"{sc.algorithm.name} on {sc.models['actor'].name}"),
        ("algorithm", sc.algorithm.name),
        ("model", sc.models["actor"].name),
        ("cluster", f"{cl.num_nodes} x {cl.gpus_per_node} {cl.accelerator.name} ({cl.num_gpus} GPUs"
                    + (f", {price:.2f} USD/GPU-h)" if price is not None else ")")),
        ("workload", f"{wl.prompts_per_step} prompts x {wl.group_size} responses, max response {wl.max_response_tokens:,} tokens"),
        ("response lengths", ans.lengths.describe().removeprefix("response lengths: ")),
        ("step-time range", (f"{fmt_range_end(iv.low_s)} - {fmt_range_end(iv.high_s)}: " if math.isfinite(iv.low_s) else "") + iv.describe()),
    ]
    if ans.framework:
        facts.append(("framework", f"only plans {ans.framework} runs"))
    if ans.run is not None:
        r = ans.run
        facts.append(("run", f"{r.steps} steps: {r.hours:,.1f} h, {r.gpu_hours:,.0f} GPU-hours on {r.num_gpus} GPUs"
                             + (f", {r.cost_usd:,.0f} USD" if r.cost_usd is not None else "")
                             + (f" ({r.interval.label} {fmt_range_end(r.interval.low_s)} - {fmt_range_end(r.interval.high_s)})"
                                if math.isfinite(r.interval.low_s) else "")))
    if ans.sweep:
        facts.append(("length sweep", ", ".join(f"mean {p.mean_response_tokens:,.0f}: {fmt_s(p.step_time_s)}" for p in ans.sweep)))
    facts.append(("search", f"{res.considered:,} candidates, {len(res.rejected):,} rejected, {len(simulated_plans(res))} simulated, "
                            f"{res.elapsed_s:.1f} s"))
    facts += [("note", n) for n in res.notes]
    b = res.best
    head = (f'<p class="headline">Best plan: <b>{html.escape(b.label)}</b> on {b.num_gpus} GPUs, '
            f"<b>{html.escape(fmt_s(b.step_time_s))}</b> per step</p>")
    compare = [b, *(e for e in (*res.baselines, res.user) if e is not None and e is not b)]
    rows, classes = [], []
    for e in compare:
        ok = e.sim is not None
        rows.append([
            plan_name(e, res), str(e.num_gpus), fmt_s(e.step_time_s) if ok else "infeasible",
            _x(e.step_time_s / b.step_time_s) if ok else "-", _usd(e.cost_usd_per_step) if ok else "-", str(e.staleness),
            f"{e.sim.tokens_per_s_per_gpu:,.0f}" if e.sim is not None else "-",
            f"infeasible: {e.error}" if e.error else "",
        ])
        classes.append("best" if e is b else ("user" if e.source == "user" else ""))
    cmp = table(["plan", "GPUs", "step time", "vs best", "USD/step", "staleness", "tokens/s/GPU", "why not"],
                rows, numeric=(1, 2, 3, 4, 5, 6), row_classes=classes)
    return (f'<section id="summary">\n{table(["", ""], [list(f) for f in facts], css="facts")}\n{head}\n'
            f"<h3>The best plan against the framework defaults and your plan</h3>\n{cmp}\n</section>")


_LABELS = ("Labels: colocated / disaggregated R+T (R rollout GPUs, T training GPUs) / hybrid; gen tpN: the rollout engine's "
           "tensor-parallel degree; train tpN ppN cpN: the training layout's tensor, pipeline and context (Ulysses) degrees; "
           "mbNk: token budget per training micro-batch, N x 1024 tokens; async s=N: at most N policy versions of lag; "
           "partial N: at most N new tokens per response per step.")


def _memory_rows(rows: Sequence[RoleMemory]) -> list[list[str]]:
    out = []
    for r in rows:
        vals = (r.weights_bytes, r.grads_bytes, r.optimizer_bytes, r.activations_bytes, r.logits_bytes, r.kv_cache_bytes,
                r.other_bytes, r.device_bytes, r.mean_device_bytes, r.capacity_bytes, r.host_bytes)
        cells = [fmt_bytes(v) if v else "-" for v in vals]
        out.append([f"{r.role} ({r.work})", f"{r.pool} ({r.pool_gpus} GPUs)", *cells, r.note])
    return out


def _memory_table(ans: PlanAnswer) -> str:
    heads = ["role (pass)", "pool", "weights", "grads", "optimizer", "activations", "logits", "KV cache", "other",
             "device (worst)", "device (mean lengths)", "HBM", "host RAM", "does not fit"]
    body = ["<h3>The best plan</h3>", table(heads, _memory_rows(ans.memory), numeric=tuple(range(2, 13)))]
    if ans.user_memory:
        body += ["<h3>Your plan</h3>", table(heads, _memory_rows(ans.user_memory), numeric=tuple(range(2, 13)))]
    return _section("breakdown", "Memory breakdown per GPU", "\n".join(body),
                    "Per role and pass, per GPU (rlperf.plan.memory_breakdown): the components at the worst micro-batch, every "
                    "sequence at the length cap (it decides the fit); device (mean lengths): the same pass with a micro-batch of "
                    "mean-length sequences. "
                    "other: ZeRO buffers (training) or the engine's step workspace; KV cache: what the engine preallocates.")


def _launch(ans: PlanAnswer) -> str:
    ex = ans.launch
    assert ex is not None
    extra = "".join(f"<li>not expressible: {html.escape(m)}</li>" for m in ex.not_expressible)
    extra += "".join(f"<li>{html.escape(n)}</li>" for n in ex.notes)
    return _section("launch", f"Launch the best plan with {ex.framework}",
                    f"<pre>{html.escape(ex.command_line())}</pre>\n<ul>{extra}</ul>")


def _ranked(plans: Sequence[PlanEvaluation], names: Sequence[str], res: PlanSearchResult) -> str:
    rows, classes = [], []
    ordered = sorted(zip(plans, names), key=lambda p: (p[0].step_time_s, p[0].label))
    for i, (e, name) in enumerate(ordered):
        assert e.sim is not None
        rows.append([
            str(i + 1), name, str(e.num_gpus), fmt_s(e.step_time_s),
            fmt_s(e.estimate.step_time_s) if e.estimate is not None else "-",
            f"{e.sim.tokens_per_s_per_gpu:,.0f}", _usd(e.cost_usd_per_step), str(e.staleness),
            fmt_s(e.sim.bounds.lower_bound_s), _x(e.sim.bounds.ratio),
        ])
        classes.append("best" if e is res.best else ("user" if e.source == "user" else ""))
    t = table(["#", "plan", "GPUs", "step time", "fast estimate", "tokens/s/GPU", "USD/step", "staleness",
               "lower bound", "step / bound"], rows, numeric=(0, 2, 3, 4, 5, 6, 7, 8, 9), row_classes=classes)
    return _section("ranked", "Ranked plans (simulated)", t,
                    "Yellow: the best plan; blue: your plan. The fast estimate ranks the candidates; the simulator decides. "
                    + _LABELS)


def _workdepth_table(e: PlanEvaluation) -> str:
    sim = e.sim
    assert sim is not None
    rows = []
    for st in sim.stages:
        par = st.work_s / st.depth_s if st.depth_s > 0 else float("inf")
        bound = max(st.work_s / max(st.gpus, 1), st.depth_s)
        rows.append([st.name, st.pool, str(st.gpus), f"{st.work_s:,.2f}", f"{st.depth_s:,.3f}",
                     f"{par:,.1f}" if par != float("inf") else "-", f"{bound:,.3f}", f"{st.time_s:,.3f}",
                     _x(st.time_s / bound) if bound > 0 else "-", fmt_bytes(st.peak_memory_bytes)])
    b = sim.bounds
    rows.append(["iteration (all stages)", f"staleness {b.staleness}", str(b.num_gpus), f"{b.work_s:,.2f}", f"{b.depth_s:,.3f}",
                 f"{b.work_s / b.depth_s:,.1f}" if b.depth_s > 0 else "-", f"{b.lower_bound_s:,.3f}", f"{sim.step_time_s:,.3f}",
                 _x(b.ratio), ""])
    return table(["stage", "pool", "GPUs P", "work W (GPU·s)", "depth D (s)", "W/D", "lower bound (s)", "predicted (s)",
                  "predicted / bound", "peak memory/GPU"], rows, numeric=(2, 3, 4, 5, 6, 7, 8, 9),
                 row_classes=[""] * (len(rows) - 1) + ["best"])


def _workdepth(plans: Sequence[PlanEvaluation], names: Sequence[str], res: PlanSearchResult) -> str:
    body = ['<p class="caption">Work W: device-seconds at the roofline rate; depth D: the critical path with unlimited devices. '
            "A stage on P GPUs takes at least max(W/P, D); the iteration's bound is max(W/P, D/(s+1), the largest stage depth) "
            "for staleness s.</p>"]
    shown = [e for e in plans if e is res.best or e.source == "user"]
    for e in shown:
        body.append(f"<h3>{html.escape(names[plans.index(e)])}</h3>\n{_workdepth_table(e)}")
    body.append("<h3>The taxonomy: work, depth, communication and memory, symbolically</h3>")
    body.append('<p class="caption">P parameters (active for MoE), N = B·G responses, L_p prompt and L_r,i response lengths, '
                "n_l layers, h hidden size, e epochs, M mini-batches, d/t/p/c/x the dp/tp/pp/cp/ep degrees, m micro-batches, "
                "s staleness, b bytes per element, t_l minimal per-layer latency.</p>")
    for title, rows in (("stages", STAGES), ("strategies", STRATEGIES)):
        body.append(f"<h3>{html.escape(title)}</h3>\n{_symbolic(rows)}")
    return _section("workdepth", "Work-depth", "\n".join(body))


def _symbolic(rows: Sequence[SymbolicRow]) -> str:
    return table(["", "work", "depth", "communication", "memory per device"],
                 [[r.what, r.work, r.depth, r.communication, r.memory_per_device] for r in rows])


def _explanation(explanation: Explanation | None) -> str:
    if explanation is None:
        return _section("explanation", "Explanation", '<p class="muted">No explanation (no simulated plan to explain).</p>')
    parts = [f'<p class="headline">the best plan: {html.escape(explanation.headline())}</p>',
             f"<p>work-depth lower bound {html.escape(fmt_s(explanation.lower_bound_s))}; "
             f"gap {html.escape(_x(explanation.gap))}</p>"]
    parts.append("<h3>Bottlenecks</h3>")
    parts.append(table(["kind", "share of the step", "detail"],
                       [[b.kind, f"{100 * b.share:.0f}%", b.detail] for b in explanation.bottlenecks], numeric=(1,)))
    parts.append("<h3>What if (simulated, changes to the best plan)</h3>")
    parts.append(table(
        ["change", "step time", "speedup", "staleness", "note"],
        [[w.change, *((fmt_s(w.step_time_s), _x(w.speedup)) if w.step_time_s != float("inf") else ("-", "-")),
          w.staleness_summary or str(w.staleness), w.note]
         for w in explanation.what_ifs], numeric=(1, 2)))
    return _section("explanation", "Explanation (the best plan)", "\n".join(parts))


def rejected_groups(res: PlanSearchResult) -> list[tuple[str, int, str]]:
    """(reason, number of plans, an example plan), most frequent reason first."""
    groups: dict[str, list[str]] = {}
    for r in res.rejected:
        groups.setdefault(r.reason, []).append(r.label)
    return sorted(((k, len(v), v[0]) for k, v in groups.items()), key=lambda g: (-g[1], g[0]))


def _rejected(res: PlanSearchResult) -> str:
    groups = rejected_groups(res)
    shown = groups[:MAX_REJECTED]
    cap = f"{len(res.rejected):,} candidates rejected for {len(groups)} reasons" + (
        f"; the {len(shown)} most frequent shown." if len(groups) > len(shown) else ".")
    body = table(["reason", "plans", "example"], [[r, str(n), ex] for r, n, ex in shown], numeric=(1,)) if shown else ""
    return _section("rejected", "Rejected plans, grouped by reason", body, cap)


def _inputs(sc: Scenario, res: PlanSearchResult) -> str:
    spec = json.dumps(sc.spec.model_dump(mode="json"), indent=1, sort_keys=True)
    plan = json.dumps(res.best.plan.model_dump(mode="json"), indent=1, sort_keys=True)
    return _section("inputs", "Inputs (for reproducibility)",
                    f"<details><summary>scenario</summary><pre>{html.escape(spec)}</pre></details>\n"
                    f"<details><summary>best plan</summary><pre>{html.escape(plan)}</pre></details>")
