"""The report's plotly figures: timeline, stage breakdown, memory against capacity, Pareto scatter.

Each function takes planner results and returns a ``plotly.graph_objects.Figure``; the page
(rlperf.report.html) turns them into divs. plotly is imported here only, so the core package
imports without it (it is the ``report`` extra).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative

from rlperf.plan.search import PlanEvaluation
from rlperf.sim.kernel import Segment
from rlperf.sim.result import SimResult

MAX_TIMELINE_TRACKS = 40  # rows of the Gantt chart; beyond it, the slowest rollout replicas are kept
TIMELINE_PIXELS = 2000  # horizontal resolution of the timeline: shorter replica spans are merged
GB = 1e9  # decimal, as the hardware catalog and the CLI tables (80 GB HBM)
_PALETTE = tuple(qualitative.Plotly) + tuple(qualitative.D3) + tuple(qualitative.Set3)


class StageColors:
    """One color per stage name, the same in every figure of a report."""

    def __init__(self) -> None:
        self._colors: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self._colors:
            self._colors[name] = _PALETTE[len(self._colors) % len(_PALETTE)]
        return self._colors[name]


def _natural(s: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def segment_stage(seg: Segment) -> str:
    """The legend entry of a segment: its stage, or ``generate · <kind>`` for the per-replica
    spans of a rollout (tracks ``<pool>/replica-<i>``, named by the engine step kind, possibly
    as ``generate/<kind>``)."""
    return f"generate · {seg.name.removeprefix('generate/')}" if "/" in seg.track else seg.name


def steady_segments(sim: SimResult) -> list[Segment]:
    """Segments of the steady-state iterations (after the warm-up), contiguous spans of the
    same stage on one track merged (the rollout emits one span per run of engine steps)."""
    segs = sorted((s for s in sim.segments if s.iteration >= sim.warmup), key=lambda s: (s.track, s.start_s))
    out: list[Segment] = []
    for s in segs:
        if out:
            last = out[-1]
            if (last.track == s.track and last.iteration == s.iteration and segment_stage(last) == segment_stage(s)
                    and abs(s.start_s - last.end_s) <= 1e-9 * max(1.0, s.start_s)):
                out[-1] = Segment(last.track, last.name, last.start_s, s.end_s, last.gpus, last.iteration)
                continue
        out.append(s)
    return out


def merge_invisible(segs: Sequence[Segment], resolution_s: float) -> tuple[list[Segment], int]:
    """Segments sorted by track and start, each span shorter than ``resolution_s`` (less than a
    pixel of the chart) on a replica track absorbed into the span before it on that track (the
    engine alternates short prefills with decodes thousands of times a step), and spans of one
    stage that then touch joined. Returns the segments and how many were absorbed."""
    out: list[Segment] = []
    absorbed = 0
    for s in sorted(segs, key=lambda s: (s.track, s.start_s)):
        if out and "/" in s.track and out[-1].track == s.track and out[-1].iteration == s.iteration:
            last = out[-1]
            short = s.end_s - s.start_s < resolution_s or last.end_s - last.start_s < resolution_s
            if short or (last.name == s.name and s.start_s - last.end_s < resolution_s):
                keep = last if last.end_s - last.start_s >= s.end_s - s.start_s else s
                out[-1] = Segment(s.track, keep.name, last.start_s, max(last.end_s, s.end_s), keep.gpus, s.iteration)
                absorbed += 1
                continue
        out.append(s)
    return out, absorbed


def timeline_tracks(segs: Sequence[Segment]) -> tuple[list[str], int]:
    """The rows to draw (pools first, then replicas in natural order) and how many replica rows
    were left out. Beyond ``MAX_TIMELINE_TRACKS`` rows the replicas that finish last (the tail
    that sets the rollout's depth) are kept."""
    end: dict[str, float] = {}
    for s in segs:
        end[s.track] = max(end.get(s.track, -math.inf), s.end_s)
    pools = sorted((t for t in end if "/" not in t), key=_natural)
    replicas = [t for t in end if "/" in t]
    room = max(MAX_TIMELINE_TRACKS - len(pools), 0)
    kept = sorted(replicas, key=lambda t: (-end[t], _natural(t)))[:room]
    parents = sorted({t.split("/", 1)[0] for t in end}, key=_natural)
    # Each pool's row, then its replicas' rows.
    rows = sorted(pools + kept, key=lambda t: (parents.index(t.split("/", 1)[0]), "/" in t, _natural(t)))
    return rows, len(replicas) - len(kept)


def timeline_figure(sim: SimResult, colors: StageColors) -> tuple[go.Figure, str]:
    """A Gantt chart of the steady-state iterations: one row per track, colored by stage, with
    dotted lines at the end of every actor update (the step boundaries). Returns the figure
    and a caption."""
    segs = steady_segments(sim)
    span = (max(s.end_s for s in segs) - min(s.start_s for s in segs)) if segs else 0.0
    segs, absorbed = merge_invisible(segs, span / TIMELINE_PIXELS)
    rows, dropped = timeline_tracks(segs)
    shown = set(rows)
    by_stage: dict[str, list[Segment]] = {}
    for s in segs:
        if s.track in shown:
            by_stage.setdefault(segment_stage(s), []).append(s)
    fig = go.Figure()
    for stage, group in by_stage.items():
        # Times rounded to the millisecond: the page carries every span of every replica, and
        # full-precision floats made the timeline most of a report's bytes.
        fig.add_trace(go.Bar(
            name=stage, orientation="h", y=[s.track for s in group], base=[round(s.start_s, 3) for s in group],
            x=[round(max(s.end_s - s.start_s, 0.0), 3) for s in group],
            # Decode is the bulk of the rollout: it takes the color of ``generate`` in the other figures.
            marker={"color": colors("generate" if stage == "generate · decode" else stage), "line": {"width": 0}},
            customdata=[[s.iteration, s.gpus] for s in group],
            hovertemplate=f"<b>{stage}</b><br>%{{y}}<br>iteration %{{customdata[0]}}, %{{customdata[1]}} GPUs"
                          "<br>from %{base:.2f} s, %{x:.2f} s long<extra></extra>",
        ))
    for s in segs:
        if s.name == "actor_update" and "/" not in s.track:
            fig.add_vline(x=s.end_s, line={"dash": "dot", "width": 1, "color": "#555"})
    fig.update_layout(
        barmode="overlay", height=160 + 26 * max(len(rows), 1), bargap=0.25,
        xaxis={"title": {"text": "time (s)"}},
        yaxis={"categoryorder": "array", "categoryarray": rows, "autorange": "reversed", "title": {"text": ""}},
        legend={"title": {"text": "stage"}}, margin={"l": 10, "r": 10, "t": 30, "b": 40},
    )
    steady = sim.iterations - sim.warmup
    caption = (f"{steady} steady-state iteration{'s' if steady != 1 else ''} after {sim.warmup} warm-up; "
               "dotted lines: ends of actor updates (step boundaries).")
    if absorbed:
        caption += (f" {absorbed} replica spans shorter than 1/{TIMELINE_PIXELS} of the chart (under a pixel) are merged"
                    " into their neighbour, named by the longer one.")
    if dropped:
        caption += f" {dropped} rollout replica rows left out (the {len([r for r in rows if '/' in r])} that finish last are shown)."
    return fig, caption


def stage_breakdown_figure(evals: Sequence[PlanEvaluation], names: Sequence[str], colors: StageColors) -> go.Figure:
    """Stacked bars of each plan's mean stage times, with its step time as a marker: stages
    on different pools (or overlapped by async execution) add up to more than the step."""
    sims = [e.sim for e in evals]
    assert all(s is not None for s in sims)
    stages: list[str] = []
    for s in sims:
        assert s is not None
        for st in s.stages:
            if st.name not in stages:
                stages.append(st.name)
    fig = go.Figure()
    for stage in stages:
        xs = []
        for s in sims:
            assert s is not None
            xs.append(sum(st.time_s for st in s.stages if st.name == stage))
        fig.add_trace(go.Bar(name=stage, orientation="h", y=list(names), x=xs, marker={"color": colors(stage)},
                             hovertemplate=f"<b>{stage}</b><br>%{{y}}<br>%{{x:.2f}} s<extra></extra>"))
    fig.add_trace(go.Scatter(
        name="step time", mode="markers", y=list(names), x=[e.step_time_s for e in evals],
        marker={"symbol": "diamond", "size": 11, "color": "black", "line": {"color": "white", "width": 1}},
        hovertemplate="<b>step time</b><br>%{y}<br>%{x:.2f} s<extra></extra>",
    ))
    fig.update_layout(
        barmode="stack", height=170 + 28 * max(len(evals), 1), xaxis={"title": {"text": "seconds per step (stage times stacked)"}},
        yaxis={"autorange": "reversed", "automargin": True}, legend={"title": {"text": "stage"}},
        margin={"l": 10, "r": 10, "t": 30, "b": 40},
    )
    return fig


def memory_figure(evals: Sequence[PlanEvaluation], names: Sequence[str]) -> go.Figure:
    """Peak memory per GPU of every pool of each plan (a horizontal bar each), against the GPU's
    capacity (a tick per bar, and a dashed line when all pools share one capacity)."""
    rows: list[str] = []
    peak: list[float] = []
    cap: list[float] = []
    util: list[float] = []
    for e, name in zip(evals, names):
        assert e.sim is not None
        for p in e.sim.pools:
            rows.append(f"{name} · pool {p.name} ({p.num_gpus} GPUs)")
            peak.append(p.peak_memory_bytes / GB)
            cap.append(p.capacity_bytes / GB)
            util.append(p.utilization)
    fig = go.Figure()
    fig.add_trace(go.Bar(
        name="peak memory per GPU", orientation="h", y=rows, x=peak,
        marker={"color": ["#d62728" if a > c else "#1f77b4" for a, c in zip(peak, cap)]},
        customdata=[[c, u] for c, u in zip(cap, util)],
        hovertemplate="%{y}<br>peak %{x:.1f} GB of %{customdata[0]:.1f} GB<br>utilization %{customdata[1]:.0%}<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        name="capacity (HBM per GPU)", y=rows, x=cap, mode="markers",
        marker={"symbol": "line-ns-open", "size": 22, "color": "black", "line": {"width": 3}},
        hovertemplate="%{y}<br>capacity %{x:.1f} GB<extra></extra>",
    ))
    if cap and max(cap) == min(cap):
        fig.add_vline(x=cap[0], line={"dash": "dash", "width": 1.5, "color": "black"})
    fig.update_layout(
        height=150 + 30 * max(len(rows), 1), xaxis={"title": {"text": "GB per GPU"}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed", "automargin": True}, margin={"l": 10, "r": 10, "t": 30, "b": 40},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
    )
    return fig


def pareto_figure(evals: Sequence[PlanEvaluation], names: Sequence[str], front: Sequence[PlanEvaluation],
                  best: PlanEvaluation) -> tuple[go.Figure, str]:
    """Step time against cost per step (GPU-hours per step when the cluster has no price);
    marker area by GPUs, color by staleness; the Pareto front (over step time, GPUs, cost and
    staleness) ringed, the best plan starred. Returns the figure and the y-axis quantity."""
    have_price = all(e.cost_usd_per_step is not None for e in evals)

    def y(e: PlanEvaluation) -> float:
        if have_price:
            assert e.cost_usd_per_step is not None
            return e.cost_usd_per_step
        return e.step_time_s * e.num_gpus / 3600.0

    ylabel = "cost per step (USD)" if have_price else "GPU-hours per step"
    max_gpus = max(e.num_gpus for e in evals)
    max_stale = max(max(e.staleness for e in evals), 1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        name="simulated plans", mode="markers", x=[e.step_time_s for e in evals], y=[y(e) for e in evals],
        text=list(names), customdata=[[e.num_gpus, e.staleness] for e in evals],
        marker={"size": [e.num_gpus for e in evals], "sizemode": "area", "sizeref": 2.0 * max_gpus / 34.0**2, "sizemin": 6,
                "color": [e.staleness for e in evals], "cmin": 0, "cmax": max_stale, "colorscale": "Viridis",
                "colorbar": {"title": {"text": "staleness"}, "dtick": 1}, "opacity": 0.8, "line": {"width": 0.5, "color": "#333"}},
        hovertemplate="%{text}<br>%{x:.2f} s per step, %{y:.3g} " + ("USD" if have_price else "GPU-h")
                      + "<br>%{customdata[0]} GPUs, staleness %{customdata[1]}<extra></extra>",
    ))
    on_front = [i for i, e in enumerate(evals) if any(e is f for f in front)]
    fig.add_trace(go.Scatter(
        name="Pareto front", mode="markers", x=[evals[i].step_time_s for i in on_front], y=[y(evals[i]) for i in on_front],
        text=[names[i] for i in on_front], hovertemplate="<b>Pareto</b> %{text}<extra></extra>",
        marker={"symbol": "circle-open", "size": 26, "line": {"width": 2.5, "color": "#d62728"}, "color": "#d62728"},
    ))
    fig.add_trace(go.Scatter(
        name="best", mode="markers", x=[best.step_time_s], y=[y(best)],
        marker={"symbol": "star", "size": 18, "color": "gold", "line": {"width": 1, "color": "black"}},
        hovertemplate="<b>best</b><extra></extra>",
    ))
    fig.update_layout(
        height=520, xaxis={"title": {"text": "step time (s)"}}, yaxis={"title": {"text": ylabel}},
        legend={"orientation": "h", "y": 1.08}, margin={"l": 10, "r": 10, "t": 30, "b": 40},
    )
    return fig, ylabel


def run_figure(steps_s: Sequence[float], points: Sequence[tuple[int, float, float]]) -> go.Figure:
    """The best plan's step time over a run (one marker line per step) and the simulated points
    (step, mean response tokens, step time) the curve is interpolated between."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        name="step time", mode="lines", x=list(range(1, len(steps_s) + 1)), y=[t / 60 for t in steps_s],
        hovertemplate="step %{x}: %{y:.2f} min<extra></extra>",
    ))
    fig.add_trace(go.Scatter(
        name="simulated", mode="markers", x=[p[0] + 1 for p in points], y=[p[2] / 60 for p in points],
        text=[f"mean response {p[1]:,.0f} tokens" for p in points], marker={"size": 10, "color": "#d62728"},
        hovertemplate="step %{x}: %{y:.2f} min, %{text}<extra></extra>",
    ))
    fig.update_layout(
        height=320, xaxis={"title": {"text": "step"}}, yaxis={"title": {"text": "step time (min)"}, "rangemode": "tozero"},
        legend={"orientation": "h", "y": 1.12}, margin={"l": 10, "r": 10, "t": 30, "b": 40},
    )
    return fig
