"""Non-torch memory of a rollout engine: what vLLM subtracts from the KV budget outside torch.

vLLM V1 sizes its KV cache as (``Worker.determine_available_memory``, ``MemoryProfilingResult``
in ``vllm/utils/mem_utils.py``)::

    KV = gpu_memory_utilization * total - weights - torch peak increase - non-torch increase

where the non-torch increase is device memory the profiling run took outside torch's caching
allocator (``mem_get_info`` used less torch reserved, after less before): NCCL communicator
buffers, custom / symmetric-memory all-reduce buffers, cuBLAS workspaces. The CUDA context is
allocated before the baseline snapshot and is not subtracted (it lives in the
``1 - gpu_memory_utilization`` margin). CUDA graphs are captured after the KV cache is sized
("Graph capturing finished in N secs, took X GiB" comes on top of the budget). vLLM #30515
(Dec 2025) added an estimate of the graph pools during profiling behind
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, off by default: the v0.19.0 log below prints it
False and sizes KV without it (its "Estimated CUDA graph memory: 0.84 GiB" is not subtracted).
It is on by default since v0.21.0 ("CUDA graph memory profiling is enabled (default since
v0.21.0)", a v0.27.1 log in gpustack/runner#251; vLLM #45178), where the estimate comes out of
the KV cache too (except dense models on Model Runner V2 from 0.25.1, whose estimate was 0,
vLLM #49224). Those releases are not described here: nothing below counts graph memory.

Figures (GiB per GPU, vLLM v0.19.0 on H100 80GB, ``max_num_batched_tokens`` 8192, the means
the llm-d-planner accuracy sweep measured over its runs of each layout,
``accuracy/results/v0.19.0/accuracy_report.md`` in llm-d-incubation/llm-d-planner @
fbd68515a903397a1b785a2189dc7512b0d55680, "Non-torch Constants Under-estimated for Multi-GPU";
one run's log line, Llama-3.1-8B tp 1: "non-torch forward increase memory: 0.25GiB",
``accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--16384.log`` @
d3121e059da88662db39a926a3ead964be97359b)::

    tp 1, pp 1    0.27     (the sweep's single-GPU runs; 0.24-0.25 for Llama-3.1-8B, Qwen2.5-7B)
    tp 1, pp 2-4  0.07     (Llama-3.1-8B)
    tp 2          2.08     (its tp-2 runs; 2.06-2.07 for Llama-3.1-8B, Qwen2.5-7B)
    tp 4          2.17     (its tp-4 runs; 2.13 for Llama-3.1-8B, Qwen2.5-7B)

Nothing was measured beyond tp 4 (nor tp > 1 with pp > 1, nor across nodes): a larger tp
takes the largest measured tp's figure, and tp > 1 with pp > 1 the tp figure. The same figures
serve every accelerator and SGLang engines (SGLang's ``mem_fraction_static`` is another
budget; no SGLang measurement is encoded): they are the one engine measurement rlperf has.
Older vLLM releases counted differently (v0.6.5 subtracted the whole non-torch memory, CUDA
context included: 1.79 GiB at tp 1, 3.58 GiB at tp 2 in vLLM #10511); the test data in
``tests/data/vllm_memory_profiles.yaml`` keep those rows apart.

Code, line for line: :func:`non_torch_bytes` picks the row for the engine's tp and pp.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlperf.specs.parallel import EngineLayout

_GIB = 2**30


@dataclass(frozen=True)
class NonTorchMemory:
    """Measured non-torch increase per GPU of one engine release (bytes)."""

    single_gpu_bytes: float  # tp = pp = 1
    pipeline_bytes: float  # tp = 1, pp >= 2
    tp_bytes: tuple[tuple[int, float], ...]  # (tp, bytes) for the measured tp > 1, ascending
    release: str

    def bytes_for(self, tp: int, pp: int) -> float:
        """The figure for a tp x pp engine (see the module docstring for the extrapolation)."""
        if tp == 1:
            return self.single_gpu_bytes if pp == 1 else self.pipeline_bytes
        below = [b for t, b in self.tp_bytes if t <= tp]
        return below[-1] if below else self.tp_bytes[0][1]


VLLM_V0_19_H100 = NonTorchMemory(
    single_gpu_bytes=round(0.27 * _GIB),
    pipeline_bytes=round(0.07 * _GIB),
    tp_bytes=((2, round(2.08 * _GIB)), (4, round(2.17 * _GIB))),
    release="vLLM v0.19.0 (V1 engine), H100 80GB",
)


def non_torch_bytes(engine: EngineLayout) -> float:
    """Non-torch bytes per GPU the engine's KV budget loses (vLLM v0.19.0 figures)."""
    return VLLM_V0_19_H100.bytes_for(engine.tp, engine.pp)
