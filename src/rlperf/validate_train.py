"""The training-step model against measured training iterations (vTrain's column format).

Each row of the file is one measured iteration of a GPT-3-style model (Megatron-DeepSpeed:
fp16, full activation recompute, 1F1B, data-parallel all-reduce after the backward without
bucketing, Megatron's unfused attention; :mod:`rlperf.data.train_measurements`). The row is
costed with :func:`rlperf.stages.train.train_step` on one node of the row's GPUs, under the
shipped profile of the accelerator (optionally with generic parameters fitted here), and

  ratio = predicted / measured,   APE = |ratio - 1|

is summarized as MAPE (mean APE), median APE, the 90th percentile of APE and the median ratio,
over all rows and by tp, pp, micro-batch size, micro-batches per data-parallel rank and hidden
size.

**Split.** A row is in the *fit* half when the first byte of the SHA-256 of its configuration
(:attr:`TrainMeasurement.config_key`: the ten configuration columns, not the measured time) is
even, else in the *hold-out* half: stable across files, orderings and runs. A fit
(:func:`fit_layer_overhead`) sees only the fit half; both halves are reported separately.

**Fit.** The backend's host time per layer and micro-batch pass
(:attr:`HardwareProfile.megatron_layer_overhead_s`, no published figure) is fitted on the fit half
alone: the value minimizing the squared relative error ``sum_i (pred_i(x) / m_i - 1)^2``, by
golden-section search on ``[0, 10 ms]`` (:func:`fit_layer_overhead`; ``pred_i`` is not linear in
``x`` because a pass takes the smooth maximum of its host and device times).
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np

from rlperf.errors import SpecError
from rlperf.inputs.ranges import GPUS, HEADS, LAYERS, PARALLEL, SEQUENCES, TOKENS, WIDTH, Quantity
from rlperf.specs.hardware import Cluster
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout

Split = Literal["fit", "holdout"]
GROUPS = ("tp", "pp", "micro_batch", "microbatches_per_rank", "hidden_size")
VTRAIN_VOCAB = 50257  # vTrainConfig's vocab_size (GPT-2's tokenizer)
COLUMNS = (
    "# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers", "sequence length",
    "tensor parallelism", "data parallelism", "pipeline parallelism", "iteration time (ms)",
)
SHIPPED = "vtrain_single.csv"


@dataclass(frozen=True)
class TrainMeasurement:
    """One measured training iteration (a row of the file)."""

    num_gpus: int
    global_batch: int
    micro_batch: int
    hidden_size: int
    num_heads: int
    num_layers: int
    seq_len: int
    tp: int
    dp: int
    pp: int
    measured_s: float

    @property
    def microbatches_per_rank(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def config_key(self) -> str:
        return (f"gpus={self.num_gpus},gbs={self.global_batch},mbs={self.micro_batch},h={self.hidden_size},"
                f"heads={self.num_heads},layers={self.num_layers},seq={self.seq_len},tp={self.tp},dp={self.dp},"
                f"pp={self.pp}")

    @property
    def split(self) -> Split:
        return "fit" if hashlib.sha256(self.config_key.encode()).digest()[0] % 2 == 0 else "holdout"

    def group_value(self, by: str) -> int:
        return int(getattr(self, by))


def shipped_csv() -> Path:
    """The shipped single-node vTrain file."""
    return Path(str(resources.files("rlperf") / "data" / "train_measurements" / SHIPPED))


# Each configuration column's plausible range: the row builds a GPT of these sizes and the model
# divides by the batch sizes and parallel degrees, so each is a positive integer in its range.
_COLUMN_RANGES: tuple[Quantity, ...] = (GPUS, SEQUENCES, SEQUENCES, WIDTH, HEADS, LAYERS, TOKENS, PARALLEL, PARALLEL,
                                        PARALLEL)
# A measured iteration runs at least a forward, a backward and an optimizer kernel, each launched
# in microseconds, so anything under 1 us is not a measured iteration (a unit mix-up); the ceiling
# is the day of rlperf.inputs.ranges.TASK_S (1e300 ms is a typo, not a measurement).
ITERATION_MS = Quantity("ms", 1e-3, 86_400e3, "a training iteration: milliseconds to minutes")


def _cell(p: Path, line: int, row: Sequence[str], col: int) -> str:
    if col >= len(row):
        raise SpecError("train_csv", f"{p} line {line}: {len(row)} columns, column '{COLUMNS[col]}' is missing",
                        f"the {len(COLUMNS)} columns {','.join(COLUMNS)}")
    return row[col].strip()


def _parse_row(p: Path, line: int, row: Sequence[str]) -> TrainMeasurement:
    """One row, every column checked on its own (the message names the line and the column)."""
    ints: list[int] = []
    for col, q in enumerate(_COLUMN_RANGES):
        text = _cell(p, line, row, col)
        try:
            v = int(text)
        except ValueError:
            raise SpecError("train_csv", f"{p} line {line}, column '{COLUMNS[col]}': {text!r} is not an integer",
                            f"an integer, {q.allowed}") from None
        q.require(f"train_csv: {p} line {line}, column '{COLUMNS[col]}'", v)
        ints.append(v)
    text = _cell(p, line, row, 10)
    try:
        ms = float(text)
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms):
        raise SpecError("train_csv", f"{p} line {line}, column '{COLUMNS[10]}': {text!r} is not a finite number",
                        f"a number, {ITERATION_MS.allowed}")
    ITERATION_MS.require(f"train_csv: {p} line {line}, column '{COLUMNS[10]}'", ms)
    g, gbs, mbs, h, heads, layers, seq, tp, dp, pp = ints
    m = TrainMeasurement(g, gbs, mbs, h, heads, layers, seq, tp, dp, pp, ms / 1e3)
    where = f"train_csv: {p} line {line}"
    if m.tp * m.dp * m.pp != m.num_gpus:
        raise SpecError(where, f"tensor x data x pipeline parallelism = {m.tp * m.dp * m.pp} is not the "
                        f"# GPUs ({m.num_gpus})", "tp x dp x pp = # GPUs")
    if m.global_batch % (m.micro_batch * m.dp):
        raise SpecError(where, f"global batch {m.global_batch} is not a multiple of micro batch x data parallelism "
                        f"({m.micro_batch * m.dp})", "micro batch x dp dividing the global batch")
    # the GPT of the row splits its hidden size over the heads and its heads over tp (Megatron),
    # and gives each pipeline stage at least one layer (rlperf.specs.parallel.check_train_layout)
    if m.hidden_size % m.num_heads:
        raise SpecError(where, f"attention heads {m.num_heads} do not divide the hidden size {m.hidden_size}",
                        "attention heads dividing the hidden size")
    if m.num_heads % m.tp:
        raise SpecError(where, f"tensor parallelism {m.tp} does not divide the attention heads {m.num_heads}",
                        "tp dividing the attention heads")
    if m.pp > m.num_layers:
        raise SpecError(where, f"pipeline parallelism {m.pp} exceeds the # layers {m.num_layers}",
                        "pp <= # layers")
    return m


def load_train_csv(path: str | Path) -> tuple[TrainMeasurement, ...]:
    """Rows of a file in vTrain's column format (a UTF-8 BOM is allowed)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("train_csv", f"no such file: {p}")
    with p.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(c.strip() for c in rows[0]) != COLUMNS:
        raise SpecError("train_csv", f"{p}: the header must be vTrain's columns", ",".join(COLUMNS))
    return tuple(_parse_row(p, i, r) for i, r in enumerate(rows[1:], start=2) if r)


@cache
def gpt3_model(hidden_size: int, num_heads: int, num_layers: int, seq_len: int) -> ModelSpec:
    """The GPT-3-style model of a row, as vTrain's ShardedGptModel builds it: a GPT-2 block (pre-
    LayerNorm with biases, plain 4h GELU MLP, biases on every linear, learned positions of
    ``seq_len`` rows, LM head tied to the word embedding), vocabulary 50,257."""
    config = {
        "model_type": "gpt2", "n_embd": hidden_size, "n_head": num_heads, "n_layer": num_layers,
        "n_positions": seq_len, "vocab_size": VTRAIN_VOCAB, "activation_function": "gelu_new",
    }
    return ModelSpec.from_hf_config(config, name=f"gpt3-h{hidden_size}-l{num_layers}")


def layout_of(m: TrainMeasurement) -> TrainLayout:
    """Megatron-DeepSpeed as vTrain ran it: ZeRO-0 data parallelism with fp16 gradients reduced
    once after the backward (no bucketing, no overlap), no sequence parallelism, full recompute,
    padded fixed-length micro-batches, Megatron's unfused attention and its training loop."""
    return TrainLayout(
        dp=m.dp, tp=m.tp, pp=m.pp, zero_stage=0, sequence_parallel=False, recompute="full",
        micro_batch_size=m.micro_batch, packing=False, param_dtype="fp16", grad_dtype="fp16",
        overlap_grad_comm=False, attention_kernel="unfused", backend="megatron",
    )


def predict_one(m: TrainMeasurement, cluster: Cluster) -> float:
    """Predicted iteration time of ``m`` (seconds) on ``cluster`` (the row's GPUs)."""
    from rlperf.stages.train import train_step

    model = gpt3_model(m.hidden_size, m.num_heads, m.num_layers, m.seq_len)
    seqs = np.full(m.global_batch, m.seq_len, dtype=np.int64)
    return train_step(model, cluster, layout_of(m), seqs).time_s


def _clusters(gpu: str, profile_path: str | None, sizes: Iterable[int], **overrides: float) -> dict[int, Cluster]:
    out = {}
    for n in sorted(set(sizes)):
        c = make_cluster(gpu, num_gpus=n, profile_path=profile_path)
        if overrides:
            c = c.model_copy(update={"profile": c.profile.model_copy(update=overrides)})
        out[n] = c
    return out


def predict_all(
    rows: Sequence[TrainMeasurement], gpu: str = "a100_80gb_sxm", profile_path: str | None = None,
    **overrides: float,
) -> np.ndarray:
    """Predicted times of ``rows`` (seconds), with profile fields ``overrides`` applied."""
    clusters = _clusters(gpu, profile_path, (m.num_gpus for m in rows), **overrides)
    out = np.empty(len(rows))
    for i, m in enumerate(rows):
        try:
            out[i] = predict_one(m, clusters[m.num_gpus])
        except SpecError as e:  # e.g. a row the model says does not fit: name the row, not only the stage
            raise SpecError("train_csv", f"row {m.config_key}: {e.field}: {e.problem}", e.allowed) from None
    return out


@dataclass(frozen=True)
class ErrorSummary:
    """Errors of a set of rows (fractions, not percent)."""

    num_rows: int
    mape: float
    median_ape: float
    p90_ape: float
    median_ratio: float

    @classmethod
    def of(cls, ratios: np.ndarray) -> ErrorSummary:
        if ratios.size == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan)
        ape = np.abs(ratios - 1.0)
        return cls(int(ratios.size), float(ape.mean()), float(np.median(ape)), float(np.percentile(ape, 90)),
                   float(np.median(ratios)))


@dataclass(frozen=True)
class GroupError:
    """The errors of the rows of one split whose ``by`` column equals ``value``."""

    split: Split
    by: str
    value: int
    errors: ErrorSummary


@dataclass(frozen=True)
class TrainValidation:
    """Predictions of every row, the fitted generic parameters, summaries per split and group."""

    profile: str
    rows: tuple[TrainMeasurement, ...]
    predicted_s: np.ndarray
    fitted: tuple[tuple[str, float], ...]  # (profile field, value) fitted on the fit half; () if none

    def ratios(self, split: Split | Literal["all"] = "all") -> np.ndarray:
        r: np.ndarray = self.predicted_s / np.array([m.measured_s for m in self.rows])
        return r if split == "all" else r[self._mask(split)]

    def _mask(self, split: Split) -> np.ndarray:
        return np.array([m.split == split for m in self.rows], dtype=bool)

    def summary(self, split: Split | Literal["all"] = "all") -> ErrorSummary:
        return ErrorSummary.of(self.ratios(split))

    def groups(self, split: Split) -> tuple[GroupError, ...]:
        mask, ratios = self._mask(split), self.ratios()
        out = []
        for by in GROUPS:
            values = np.array([m.group_value(by) for m in self.rows])
            for v in sorted(set(values[mask].tolist())):
                out.append(GroupError(split, by, int(v), ErrorSummary.of(ratios[mask & (values == v)])))
        return tuple(out)

    def worst_group_ratio(self, split: Split, by: Sequence[str] = ("tp", "micro_batch")) -> float:
        """The group median ratio farthest from 1 (in log) among the groups ``by``."""
        meds = [g.errors.median_ratio for g in self.groups(split) if g.by in by]
        return max(meds, key=lambda r: abs(np.log(r)))


def fit_layer_overhead(
    rows: Sequence[TrainMeasurement], gpu: str = "a100_80gb_sxm", profile_path: str | None = None,
    field: str = "megatron_layer_overhead_s", upper_s: float = 10e-3, tolerance_s: float = 1e-6,
) -> float:
    """``field`` minimizing the squared relative error over the fit half of ``rows``
    (module docstring): golden-section search on ``[0, upper_s]`` down to ``tolerance_s``."""
    fit = [m for m in rows if m.split == "fit"]
    if not fit:
        raise SpecError("train_csv", "no rows in the fit half")
    meas = np.array([m.measured_s for m in fit])

    def loss(x: float) -> float:
        return float(np.sum((predict_all(fit, gpu, profile_path, **{field: x}) / meas - 1.0) ** 2))

    inv_phi = (np.sqrt(5.0) - 1.0) / 2.0
    lo, hi = 0.0, upper_s
    a, b = hi - inv_phi * (hi - lo), lo + inv_phi * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > tolerance_s:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - inv_phi * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + inv_phi * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2.0


def validate_train(
    path: str | Path | None = None, gpu: str = "a100_80gb_sxm", profile_path: str | None = None,
    fit: bool = True,
) -> TrainValidation:
    """Score the training-step model against the file ``path`` (default: the shipped vTrain file);
    with ``fit``, the backend's per-layer overhead is fitted on the fit half first."""
    rows = load_train_csv(path if path is not None else shipped_csv())
    fitted: tuple[tuple[str, float], ...] = ()
    if fit:
        fitted = (("megatron_layer_overhead_s", fit_layer_overhead(rows, gpu, profile_path)),)
    pred = predict_all(rows, gpu, profile_path, **dict(fitted))
    label = gpu + (f" + {profile_path}" if profile_path else " (shipped profile)")
    return TrainValidation(label, rows, pred, fitted)
