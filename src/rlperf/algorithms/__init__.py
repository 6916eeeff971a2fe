"""RL algorithms as stage graphs: which model runs which pass over which tokens, after what."""

from rlperf.algorithms.registry import get_algorithm, list_algorithms, register_algorithm
from rlperf.algorithms.spec import AlgorithmSpec, StageDef

__all__ = ["AlgorithmSpec", "StageDef", "get_algorithm", "list_algorithms", "register_algorithm"]
