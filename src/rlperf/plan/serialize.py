"""The planner's JSON output (schema: docs/plan.schema.json, version 1)."""

from __future__ import annotations

from typing import Any

from rlperf.plan.explain import Explanation
from rlperf.plan.search import PlanEvaluation, PlanSearchResult

SCHEMA_VERSION = 1


def evaluation_json(e: PlanEvaluation) -> dict[str, Any]:
    sim = e.sim
    return {
        "label": e.label,
        "source": e.source,
        "num_gpus": e.num_gpus,
        "step_time_s": e.step_time_s,
        "estimated_step_time_s": e.estimate.step_time_s if e.estimate else None,
        "cost_usd_per_step": e.cost_usd_per_step,
        "staleness": e.staleness,
        "tokens_per_s_per_gpu": sim.tokens_per_s_per_gpu if sim else None,
        "lower_bound_s": sim.bounds.lower_bound_s if sim else None,
        "stages": [{"name": s.name, "pool": s.pool, "time_s": s.time_s} for s in sim.stages] if sim else [],
        "pools": [
            {"name": p.name, "num_gpus": p.num_gpus, "utilization": p.utilization,
             "peak_memory_bytes": p.peak_memory_bytes, "capacity_bytes": p.capacity_bytes}
            for p in sim.pools
        ] if sim else [],
        "plan": e.plan.model_dump(mode="json"),
        "error": e.error,
    }


def search_json(res: PlanSearchResult, explanation: Explanation | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "scenario": res.scenario,
        "num_gpus": res.num_gpus,
        "candidates_considered": res.considered,
        "candidates_rejected": len(res.rejected),
        "estimates_per_s": res.estimates_per_s if res.estimates_per_s != float("inf") else None,
        "elapsed_s": res.elapsed_s,
        "best": evaluation_json(res.best),
        "ranked": [evaluation_json(e) for e in res.evaluated],
        "baselines": [evaluation_json(e) for e in res.baselines],
        "user_plan": evaluation_json(res.user) if res.user else None,
        "pareto": [e.label + f" @ {e.num_gpus} GPUs" for e in res.pareto],
        "rejected": [{"label": r.label, "reason": r.reason} for r in res.rejected[:200]],
        "notes": list(res.notes),
    }
    if explanation is not None:
        out["explanation"] = {
            "headline": explanation.headline(),
            "lower_bound_s": explanation.lower_bound_s,
            "gap": explanation.gap,
            "bottlenecks": [{"kind": b.kind, "share": b.share, "detail": b.detail} for b in explanation.bottlenecks],
            "what_ifs": [
                {"change": w.change, "step_time_s": w.step_time_s if w.step_time_s != float("inf") else None,
                 "speedup": w.speedup, "staleness": w.staleness, "note": w.note}
                for w in explanation.what_ifs
            ],
        }
    return out
