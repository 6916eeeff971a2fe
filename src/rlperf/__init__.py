"""rlperf: performance model, simulator and planner for RL post-training of reasoning LMs.

The core (specs, cost, stages, simulator, planner) imports without torch; the reference
runtime lives behind the ``runtime`` extra.
"""

__version__ = "0.1.0"
