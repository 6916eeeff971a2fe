"""The softmax of unfused attention: one fused kernel, or the training backend's fallback.

Megatron's core attention (Megatron-LM ``megatron/core/transformer/dot_product_attention.py``;
Megatron-DeepSpeed ``megatron/model/transformer.py``, the code vTrain profiled) writes the scores
``[b, np, sq, sk]`` of a micro-batch (``b`` sequences, ``np = heads / tp`` on the rank,
``sq = sk = L`` the padded length) and hands them to ``FusedScaleMaskSoftmax``. Its
``is_kernel_available`` (``megatron/core/fusions/fused_softmax.py``) runs the fused CUDA kernel
(``scaled_upper_triang_masked_softmax`` for the causal mask) only when the input is fp16/bf16 and

    16 < sk <= 4096,  sq % 4 == 0,  sk % 4 == 0,  b np % 4 == 0,  b np % batch_per_block == 0

with ``batch_per_block = (128 / min(32, P)) x (2 if P <= 128 else 1)``, ``P`` the next power of
two ``>= sk`` (``get_batch_per_block``, ``scaled_masked_softmax.h``). Megatron-DeepSpeed's older
``custom_kernel_constraint`` has ``sk <= 2048`` and no ``batch_per_block`` test; for
``128 < sk <= 2048`` the two agree (``batch_per_block = 4``).

Otherwise ``forward_torch_softmax`` runs in PyTorch, in fp32: ``input.float()``, ``input *
scale``, ``masked_fill_``, ``torch.nn.Softmax``, ``.half()``: five kernels for the fused one.
HBM bytes per score element (read + write):

    forward   2+4 (cast), 4+4 (scale), 4+4 (mask), 4+4 (softmax), 4+2 (cast) = 36   (fused: 4)
    backward  2+4, 4+4+4 (softmax: grad, output, grad in), 4+4, 4+4, 4+2     = 40   (fused: 6)

and four more ops for the host to dispatch in every pass (forward, recompute, backward: autograd
runs one backward node per forward op). The backend's host time per layer
(:meth:`HardwareProfile.train_layer_overhead_s`) is spread evenly over the kernels of a layer, so
the four extra ops of a pass cost ``overhead x 4 / kernels per layer`` (:mod:`rlperf.stages.
pass_cost`).

The FSDP / DeepSpeed backends (Hugging Face models) have no fused kernel to fall back from: their
eager attention always runs its PyTorch ops (mask add, clamp, fp32 softmax, cast), whose bytes
:mod:`rlperf.stages.pass_cost` counts in its kernel table (``HF_EAGER_FORWARD_BYTES``).
"""

from __future__ import annotations

import numpy as np

from rlperf.specs.parallel import TrainBackend

FUSED_BYTES = {False: 4.0, True: 6.0}  # per score element, forward / backward (the fused kernel)
FALLBACK_BYTES = {False: 36.0, True: 40.0}  # the PyTorch fp32 fallback (module docstring)
FALLBACK_EXTRA_KERNELS = 4  # five kernels for one, per layer and pass


def _batch_per_block(sk: np.ndarray) -> np.ndarray:
    """``get_batch_per_block`` of Megatron's scaled-masked-softmax kernel for key length ``sk``."""
    p2 = 2 ** np.ceil(np.log2(np.maximum(sk, 1)))
    warp = np.minimum(p2, 32)
    per_block: np.ndarray = (128 // warp) * np.where(p2 <= 128, 2, 1)
    return per_block


def fused_softmax_available(
    backend: TrainBackend, sequences: np.ndarray, heads_per_rank: int, length: np.ndarray
) -> np.ndarray:
    """Per micro-batch: does ``backend``'s unfused attention run the fused softmax kernel, for
    ``sequences`` sequences of padded ``length`` each and ``heads_per_rank`` heads on the rank?
    (module docstring; always for the FSDP backend)."""
    if backend != "megatron":
        return np.ones(np.shape(sequences), dtype=bool)
    sk = np.asarray(length, dtype=np.int64)
    batches = np.asarray(sequences, dtype=np.int64) * int(heads_per_rank)
    ok = (sk > 16) & (sk <= 4096) & (sk % 4 == 0) & (batches % 4 == 0)
    fused: np.ndarray = ok & (batches % _batch_per_block(sk).astype(np.int64) == 0)
    return fused
