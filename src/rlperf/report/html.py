"""The planner's report: one self-contained HTML file (plotly.js inline, no network to open it).

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlperf.cli.render import fmt_bytes, fmt_s
from rlperf.errors import SpecError
from rlperf.plan.explain import Explanation
from rlperf.plan.search import PlanEvaluation, PlanSearchResult
from rlperf.scenario import Scenario
from rlperf.workdepth import STAGES, STRATEGIES, SymbolicRow

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


def write_report(out_dir: Path, sc: Scenario, res: PlanSearchResult, explanation: Explanation | None) -> Path:
    """Write ``out_dir/plan-report.html`` and return its path."""
    from rlperf.outputs import write_text

    return write_text(Path(out_dir) / REPORT_NAME, render_report(sc, res, explanation))  # atomic: never half a report


def render_report(sc: Scenario, res: PlanSearchResult, explanation: Explanation | None) -> str:
    try:
        from plotly.offline import get_plotlyjs

        from rlperf.report import figures as fg
    except ImportError:
        raise SpecError("--report", "the HTML report needs plotly", "pip install 'rlperf[report]'") from None
    plans = simulated_plans(res)
    names = [plan_name(e, res) for e in plans]
    colors = fg.StageColors()
    best = res.best
    parts: list[str] = [_header(sc, res), _ranked(plans, names, res)]
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
        "Peak memory per GPU of each pool (red: above capacity); black ticks: the GPU's HBM capacity."))
    pfig, ylabel = fg.pareto_figure(plans, names, res.pareto, best)
    parts.append(_section(
        "pareto", "Pareto front", _div(pfig, "fig-pareto"),
        f"Every simulated plan: step time against {ylabel}; marker area by GPUs, color by staleness. Ringed: the Pareto "
        "front over (step time, GPUs, cost per step, staleness), all minimized."))
    parts.append(_workdepth(plans, names, res))
    parts.append(_explanation(explanation, res))
    parts.append(_rejected(res))
    parts.append(_inputs(sc, res))
    title = f"rlperf plan: {sc.name}"
    nav = "".join(f'<a href="#{k}">{html.escape(v)}</a>' for k, v in (
        ("summary", "summary"), ("ranked", "ranked plans"), ("timeline", "timeline"), ("stages", "stages"), ("memory", "memory"),
        ("pareto", "Pareto"), ("workdepth", "work-depth"), ("explanation", "explanation"), ("rejected", "rejected"),
        ("inputs", "inputs")))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n"
        f"<script>{get_plotlyjs()}</script>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<nav>{nav}</nav>\n" + "\n".join(parts) + "\n</body>\n</html>\n"
    )


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


def _header(sc: Scenario, res: PlanSearchResult) -> str:
    wl = sc.workload
    cl = sc.cluster
    price = cl.accelerator.price_usd_per_hour
    facts = [
        ("scenario", sc.name),
        ("algorithm", sc.algorithm.name),
        ("model", sc.models["actor"].name),
        ("cluster", f"{cl.num_nodes} x {cl.gpus_per_node} {cl.accelerator.name} ({cl.num_gpus} GPUs"
                    + (f", {price:.2f} USD/GPU-h)" if price is not None else ")")),
        ("workload", f"{wl.prompts_per_step} prompts x {wl.group_size} responses, max response {wl.max_response_tokens:,} tokens"),
        ("search", f"{res.considered:,} candidates, {len(res.rejected):,} rejected, {len(simulated_plans(res))} simulated, "
                   f"{res.elapsed_s:.1f} s"),
    ]
    facts += [("note", n) for n in res.notes]
    b = res.best
    head = (f'<p class="headline">Best plan: <b>{html.escape(b.label)}</b> on {b.num_gpus} GPUs, '
            f"<b>{html.escape(fmt_s(b.step_time_s))}</b> per step</p>")
    compare = [b, *(e for e in (*res.baselines, res.user) if e is not None and e is not b)]
    rows, classes = [], []
    for e in compare:
        ok = e.sim is not None
        rows.append([
            plan_name(e, res), str(e.num_gpus), fmt_s(e.step_time_s) if ok else "-",
            _x(e.step_time_s / b.step_time_s) if ok else "-", _usd(e.cost_usd_per_step) if ok else "-", str(e.staleness),
            f"{e.sim.tokens_per_s_per_gpu:,.0f}" if e.sim is not None else "-",
            e.error or "",
        ])
        classes.append("best" if e is b else ("user" if e.source == "user" else ""))
    cmp = table(["plan", "GPUs", "step time", "vs best", "USD/step", "staleness", "tokens/s/GPU", "error"],
                rows, numeric=(1, 2, 3, 4, 5, 6), row_classes=classes)
    return (f'<section id="summary">\n{table(["", ""], [list(f) for f in facts], css="facts")}\n{head}\n'
            f"<h3>The best plan against the framework defaults and your plan</h3>\n{cmp}\n</section>")


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
                    "Yellow: the best plan; blue: your plan. The fast estimate ranks the candidates; the simulator decides.")


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


def _explanation(explanation: Explanation | None, res: PlanSearchResult) -> str:
    if explanation is None:
        return _section("explanation", "Explanation", '<p class="muted">No explanation (no simulated plan to explain).</p>')
    # The CLI explains your plan when it was simulated, else the best plan (rlperf.cli.plan_cmd).
    who = "your plan" if res.user is not None and res.user.sim is not None else "the best plan"
    parts = [f'<p class="headline">{html.escape(who)}: {html.escape(explanation.headline())}</p>',
             f"<p>work-depth lower bound {html.escape(fmt_s(explanation.lower_bound_s))}; "
             f"gap {html.escape(_x(explanation.gap))}</p>"]
    parts.append("<h3>Bottlenecks</h3>")
    parts.append(table(["kind", "share of the step", "detail"],
                       [[b.kind, f"{100 * b.share:.0f}%", b.detail] for b in explanation.bottlenecks], numeric=(1,)))
    parts.append("<h3>What if (simulated)</h3>")
    parts.append(table(
        ["change", "step time", "speedup", "staleness", "note"],
        [[w.change, *((fmt_s(w.step_time_s), _x(w.speedup)) if w.step_time_s != float("inf") else ("-", "-")),
          str(w.staleness), w.note]
         for w in explanation.what_ifs], numeric=(1, 2, 3)))
    return _section("explanation", f"Explanation ({who})", "\n".join(parts))


def _rejected(res: PlanSearchResult) -> str:
    n = len(res.rejected)
    shown = res.rejected[:MAX_REJECTED]
    cap = f"{n:,} candidates rejected" + (f"; the first {len(shown)} shown." if n > len(shown) else ".")
    body = table(["plan", "reason"], [[r.label, r.reason] for r in shown]) if shown else ""
    return _section("rejected", "Rejected plans", body, cap)


def _inputs(sc: Scenario, res: PlanSearchResult) -> str:
    spec = json.dumps(sc.spec.model_dump(mode="json"), indent=1, sort_keys=True)
    plan = json.dumps(res.best.plan.model_dump(mode="json"), indent=1, sort_keys=True)
    return _section("inputs", "Inputs (for reproducibility)",
                    f"<details><summary>scenario</summary><pre>{html.escape(spec)}</pre></details>\n"
                    f"<details><summary>best plan</summary><pre>{html.escape(plan)}</pre></details>")
