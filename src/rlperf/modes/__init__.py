"""Execution modes and generation rounds as objects (rlperf.modes.execution, .sampling)."""

from rlperf.modes.execution import (
    AsyncSettings,
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

__all__ = ["AsyncSettings", "BoundedAsync", "Fusion", "GenerationRounds", "Mode", "OneStepOff", "PartialRollout", "StepParts", "Streaming", "Sync",
           "mode_of"]
