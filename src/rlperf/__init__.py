"""rlperf: performance model, simulator and planner for RL post-training of reasoning LMs.

The core (specs, cost, stages, simulator, planner) imports without torch; the reference
runtime lives behind the ``runtime`` extra.
"""

__version__ = "0.1.0"

from rlperf.api import PlanAnswer, RunTotals, analyze, plan, simulate  # light: the API imports its machinery on call

__all__ = ["PlanAnswer", "RunTotals", "__version__", "analyze", "plan", "simulate"]
