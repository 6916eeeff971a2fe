"""Execution modes and generation rounds as objects (rlperf.modes.execution, .sampling)."""

from rlperf.modes.execution import (
    BoundedAsync,
    Fusion,
    Mode,
    OneStepOff,
    PartialRollout,
    StepParts,
    Streaming,
    Sync,
    mode_of,
)
from rlperf.modes.sampling import GenerationRounds

__all__ = ["BoundedAsync", "Fusion", "GenerationRounds", "Mode", "OneStepOff", "PartialRollout", "StepParts", "Streaming", "Sync",
           "mode_of"]
