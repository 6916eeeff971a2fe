"""Physical ranges of the numbers a user can set: outside its range a value is an error, near the
edge of it a warning.

A value outside these ranges is not a configuration anyone runs: it is a typo (``peak_flops:
1.5``), a unit mix-up (seconds for microseconds), or an attempt to make the tool work forever
(``num_nodes: 1e9``). Every range below says why its bounds are where they are; the hard bound
is set well beyond the largest real system so that no real input is refused, and the warning
bound at the largest published system, so that an unusual but real input is accepted with a
note.

Use as a pydantic annotation, e.g. ``num_nodes: NumNodes = 1``; an out-of-range value fails
validation with the range as the ``allowed`` part of the one-line error.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Annotated, TypeVar

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

N = TypeVar("N", int, float)


class RangeWarning(UserWarning):
    """A value inside its physical range but near its edge (unusual; worth a second look)."""


@dataclass(frozen=True)
class Quantity:
    """A physical quantity's plausible range ``[lo, hi]`` and the band that earns a warning."""

    unit: str  # what one counts, e.g. "GPUs per node", "FLOP/s"
    lo: float
    hi: float
    why: str  # where the bounds come from
    warn_below: float | None = None
    warn_above: float | None = None

    @property
    def allowed(self) -> str:
        return f"{_fmt(self.lo)} to {_fmt(self.hi)} {self.unit}"

    def check(self, value: N) -> N:
        """``value`` if within the range (warning near its edge), else a pydantic error."""
        v = float(value)
        if not math.isfinite(v) or not self.lo <= v <= self.hi:
            raise PydanticCustomError("out_of_range", "outside the plausible range", {"expected": self.allowed})
        if self.warn_above is not None and v > self.warn_above:
            warnings.warn(f"{_fmt(v)} {self.unit} is beyond {_fmt(self.warn_above)}, the largest known real "
                          f"setting ({self.why})", RangeWarning, stacklevel=2)
        elif self.warn_below is not None and v < self.warn_below:
            warnings.warn(f"{_fmt(v)} {self.unit} is below {_fmt(self.warn_below)}, the smallest known real "
                          f"setting ({self.why})", RangeWarning, stacklevel=2)
        return value


    def require(self, field: str, value: float) -> None:
        """For a model validator: a SpecError naming ``field`` outside the range (warning near its edge)."""
        try:
            self.check(value)
        except PydanticCustomError:
            from rlperf.errors import SpecError

            raise SpecError(field, f"{_fmt(float(value))} {self.unit} is outside the plausible range", self.allowed) from None


def _fmt(x: float) -> str:
    if x == int(x) if math.isfinite(x) else False:
        return f"{int(x):,}" if abs(x) < 1e7 else f"{x:.3g}"
    return f"{x:.3g}"


# ---------------------------------------------------------------------------- counts of hardware
NODES = Quantity("nodes", 1, 16_384, "the largest training clusters hold ~100k GPUs, ~12k nodes of 8",
                 warn_above=4_096)
GPUS_PER_NODE = Quantity("GPUs per node", 1, 144, "a scale-up domain: 8 (HGX) to 72 (GB200 NVL72), 144 dies (NVL144)",
                         warn_above=72)
GPUS = Quantity("GPUs", 1, 131_072, "the largest training clusters hold ~100k GPUs; simulating 131k takes seconds",
               warn_above=32_768)
PARALLEL = Quantity("(a parallel degree)", 1, 16_384, "a parallel degree never exceeds the GPUs of a large cluster")
# ---------------------------------------------------------------------------- counts of work
PROMPTS = Quantity("prompts per step", 1, 65_536, "published RL batches: 32 to 8,192 prompts per step",
                   warn_above=16_384)
RESPONSES = Quantity("responses per step", 1, 524_288, "published RL steps: up to 131k responses (8,192 prompts x 16); "
                     "the simulator samples each one", warn_above=131_072)
GROUP_SIZE = Quantity("responses per prompt", 1, 4_096, "GRPO groups: 4 to 64; the largest published: 512",
                      warn_above=512)
TOKENS = Quantity("tokens", 1, 4_194_304, "the longest context windows: 1M to 4M tokens", warn_above=1_048_576)
SEQUENCES = Quantity("sequences", 1, 1_048_576, "sequences per micro-batch or engine step: 1 to a few thousand")
EPOCHS = Quantity("epochs", 1, 1_000, "PPO reuses a batch 1 to 4 times; more over-fits it", warn_above=16)
MINIBATCHES = Quantity("mini-batches", 1, 1_048_576, "optimizer updates per epoch, at most one per response")
ITERATIONS = Quantity("iterations", 1, 10_000, "a simulation needs a few steps to reach steady state",
                      warn_above=1_000)
RUN_STEPS = Quantity("steps", 1, 10_000_000, "RL runs: hundreds to a few thousand optimizer steps", warn_above=100_000)
STALENESS = Quantity("policy versions", 0, 1_024, "async RL lags by 1 to 8 policy versions", warn_above=64)
FUSION_CHUNKS = Quantity("chunks", 1, 4_096, "stage fusion streams a rollout in a few to tens of waves",
                         warn_above=256)
TRAIN_PARTS = Quantity("local updates", 1, 4_096, "verl fully_async trains a sync batch in 1 to tens of local updates",
                       warn_above=256)
GROUPS_PER_ENGINE = Quantity("prompt groups", 1, 65_536,
                             "verl fully_async keeps 16 prompt groups per rollout server in flight", warn_above=4_096)
CPU_WORKERS = Quantity("workers", 1, 1_048_576, "reward workers or sandboxes: tens to thousands")
# ---------------------------------------------------------------------------- model shapes
LAYERS = Quantity("layers", 1, 2_048, "published decoders: 12 to 126 layers (Llama 3.1 405B)", warn_above=256)
WIDTH = Quantity("elements", 1, 1_048_576, "hidden and MLP widths: 512 to ~100k (the widest published: 73,728)",
                 warn_above=262_144)
HEADS = Quantity("heads", 1, 16_384, "attention heads: 8 to 128")
VOCAB = Quantity("tokens", 1, 16_777_216, "vocabularies: 32k to 262k entries", warn_above=1_048_576)
EXPERTS = Quantity("experts", 1, 65_536, "MoE models: 8 to 384 routed experts")
# ---------------------------------------------------------------------------- rates and times
FLOPS = Quantity("FLOP/s", 1e9, 1e18, "one accelerator: ~1e13 (old GPUs, FP32) to ~1e16 (FP4 Blackwell)",
                 warn_below=1e12, warn_above=5e16)
BYTES = Quantity("bytes", 1e6, 1e14, "accelerator memory: 16 GB to 288 GB")
BANDWIDTH = Quantity("bytes/s", 1e6, 1e15, "links and memories: 1 GB/s (PCIe 1x) to 8 TB/s (HBM3e)",
                     warn_above=1e14)
LAUNCH_S = Quantity("s", 0, 1e-2, "per-kernel and per-step fixed costs: microseconds", warn_above=1e-3)
OVERHEAD_S = Quantity("s", 0, 1.0, "per-step, per-layer and per-tensor fixed costs: microseconds to milliseconds",
                      warn_above=0.1)
TASK_S = Quantity("s", 0, 86_400, "a reward or sandbox call: milliseconds to minutes", warn_above=3_600)

NumNodes = Annotated[int, AfterValidator(NODES.check)]
GpusPerNode = Annotated[int, AfterValidator(GPUS_PER_NODE.check)]
NumGpus = Annotated[int, AfterValidator(GPUS.check)]
Degree = Annotated[int, AfterValidator(PARALLEL.check)]
NumPrompts = Annotated[int, AfterValidator(PROMPTS.check)]
GroupSize = Annotated[int, AfterValidator(GROUP_SIZE.check)]
NumTokens = Annotated[int, AfterValidator(TOKENS.check)]
# The median of an *untruncated* log-normal is a parameter, not a length: a mean close to the cap
# with a wide sigma needs a median far past the cap (every draw above it is set to the cap), so it
# is bounded only to stay finite. E.g. mean 0.999 x cap, sigma 4: median ~ cap x e^12.4.
MEDIAN_PARAMETER_MAX_TOKENS = 1e15
LogNormalMedianF = Annotated[float, Field(gt=0, le=MEDIAN_PARAMETER_MAX_TOKENS)]
NumSequences = Annotated[int, AfterValidator(SEQUENCES.check)]
NumEpochs = Annotated[int, AfterValidator(EPOCHS.check)]
NumMinibatches = Annotated[int, AfterValidator(MINIBATCHES.check)]
NumIterations = Annotated[int, AfterValidator(ITERATIONS.check)]
Staleness = Annotated[int, AfterValidator(STALENESS.check)]
FusionChunks = Annotated[int, AfterValidator(FUSION_CHUNKS.check)]
TrainParts = Annotated[int, AfterValidator(TRAIN_PARTS.check)]
GroupsPerEngine = Annotated[int, AfterValidator(GROUPS_PER_ENGINE.check)]
NumWorkers = Annotated[int, AfterValidator(CPU_WORKERS.check)]
NumLayers = Annotated[int, AfterValidator(LAYERS.check)]
Width = Annotated[int, AfterValidator(WIDTH.check)]
NumHeads = Annotated[int, AfterValidator(HEADS.check)]
VocabSize = Annotated[int, AfterValidator(VOCAB.check)]
NumExperts = Annotated[int, AfterValidator(EXPERTS.check)]
FlopRate = Annotated[float, AfterValidator(FLOPS.check)]
Bytes = Annotated[float, AfterValidator(BYTES.check)]
Bandwidth = Annotated[float, AfterValidator(BANDWIDTH.check)]
LaunchSeconds = Annotated[float, AfterValidator(LAUNCH_S.check)]
OverheadSeconds = Annotated[float, AfterValidator(OVERHEAD_S.check)]
TaskSeconds = Annotated[float, AfterValidator(TASK_S.check)]


def check_option(option: str, value: N | None, quantity: Quantity) -> N | None:
    """A command-line number checked against its range (None: not given); SpecError naming ``option``."""
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v) or not quantity.lo <= v <= quantity.hi:
        from rlperf.errors import SpecError

        raise SpecError(option, f"{_fmt(v)} is outside the plausible range", quantity.allowed)
    quantity.check(value)
    return value


MAX_JOBS = 4_096


def check_jobs(jobs: int) -> None:
    """``--jobs``: worker processes, 0 for all cores (plan and validate share it)."""
    if not 0 <= jobs <= MAX_JOBS:
        from rlperf.errors import SpecError

        raise SpecError("--jobs", f"{jobs} is outside the useful range", f"0 (all cores) to {MAX_JOBS:,}")
