"""Parallel layouts: how one model is spread over devices for training and for generation.

A :class:`TrainLayout` is a Megatron/FSDP-style layout for a trained or forward-only model
(dp x tp x pp x cp ranks). Routed experts have their own grid as in Megatron-Core MoE
("MoE parallel folding"): each pipeline stage's ``dp x cp x tp`` ranks are regrouped as
``edp x ep x etp`` (expert data, expert and expert-tensor parallel, etp innermost), so ``ep x etp``
must divide ``dp x cp x tp``; ``etp`` defaults to ``tp`` (experts split like the dense MLP, ep
carved out of dp x cp), and ``etp = 1`` lets ep fold over the tensor ranks. An
:class:`EngineLayout` is a vLLM/SGLang-style rollout engine layout (replicas x tp x pp).
Both are frozen specs; divisibility against a model is checked by :func:`check_train_layout`
and :func:`check_engine_layout` so an infeasible plan is rejected with its reason.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlperf.inputs.ranges import Degree, NumGpus, NumSequences, NumTokens
from rlperf.errors import SpecError
from rlperf.specs.base import Spec
from rlperf.specs.model import ModelSpec

ZeroStage = Literal[0, 1, 2, 3]
TrainComputeDtype = Literal["bf16", "fp8"]  # 3 == FSDP full sharding
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["1f1b", "interleaved", "gpipe"]
ContextParallel = Literal["ring", "ulysses"]
AttentionKernel = Literal["flash", "unfused"]
LogitsDtype = Literal["bf16", "fp32"]
TrainBackend = Literal["megatron", "fsdp"]  # Megatron-LM / Megatron-DeepSpeed; FSDP or DeepSpeed ZeRO engines
Batching = Literal["continuous", "static"]
GatherUnit = Literal["layer", "module"]


class TrainLayout(Spec):
    """Layout of a model on a training (or forward-only) engine."""

    # In a plan, dp is derived from the GPUs of the model's pool (dp = gpus / (tp·pp·cp)); ep must
    # then divide dp·cp (checked where dp is known: rlperf.sim.costs).
    dp: Degree = 1
    tp: Degree = 1
    pp: Degree = 1
    cp: Degree = 1  # context/sequence parallel degree over the sequence
    cp_kind: ContextParallel = "ring"  # ring attention (Megatron CP) or Ulysses all-to-all (verl/DeepSpeed)
    ep: Degree = 1  # expert parallel degree (ep x etp divides dp*cp*tp)
    # expert tensor parallel degree (Megatron expert_tensor_parallel_size); None: tp
    etp: Degree | None = None
    sequence_parallel: bool = True  # Megatron SP on the TP group (activations sharded by tp)
    zero_stage: ZeroStage = 3
    pp_schedule: PipelineSchedule = "1f1b"
    virtual_stages: Degree = 1  # model chunks per pp rank (interleaved)
    recompute: Recompute = "full"
    micro_batch_size: NumSequences = 1  # sequences per micro-batch (when no token budget)
    max_tokens_per_microbatch: NumTokens | None = None  # dynamic batching / packing
    # Forward-only passes (old/ref log-probs, values) may cut larger micro-batches than training
    # (verl log_prob_micro_batch_size_per_gpu / log_prob_max_token_len_per_gpu); None: as training.
    forward_micro_batch_size: NumSequences | None = None
    forward_max_tokens_per_microbatch: NumTokens | None = None
    # dtype the logits of a forward-only pass are held in while its log-probs are taken: "fp32"
    # (upcast before the log-softmax: one fp32 copy counted); "bf16" (kept in the compute dtype,
    # verl with use_remove_padding: temperature divided in place, log-probs by a fused in-place
    # cross-entropy, entropy through torch.compile: one bf16 copy)
    forward_logits_dtype: LogitsDtype = "fp32"
    # sequences of a micro-batch packed without padding (verl use_remove_padding, OpenRLHF
    # --packing_samples); False: each is padded to the micro-batch's longest (HF eager batches)
    packing: bool = True
    offload_params: bool = False
    offload_optimizer: bool = False
    # Host threads one rank's CPU optimizer runs on (its OMP_NUM_THREADS: DeepSpeed's CPUAdam and
    # torch's CPU AdamW parallelize with OpenMP). Ray starts a worker actor with floor(its CPUs),
    # 1 when it asks for none (ray._private.utils.set_omp_num_threads_if_unset): verl's workers
    # ask for none, OpenRLHF's for num_gpus_per_actor (1 or a fraction); torchrun sets 1 when it
    # starts more than one process per node. Read only with offload_optimizer.
    cpu_optimizer_threads: int = Field(default=1, ge=1, le=1024)
    # LoRA adapters of this rank on every linear layer, the model's weights frozen (verl
    # lora_rank, OpenRLHF --lora_rank); 0: full fine-tuning (rlperf.cost.lora)
    lora_rank: int = Field(default=0, ge=0, le=65536)
    param_dtype: str = "bf16"
    grad_dtype: str = "fp32"  # gradient reduction dtype (verl FSDP reduces in fp32)
    # dtype of the weight GEMMs: fp8 = Transformer Engine / Megatron FP8 training (GEMMs at the
    # FP8 rate, an FP8 copy of each weight cached next to the param_dtype one)
    compute_dtype: TrainComputeDtype = "bf16"
    overlap_grad_comm: bool = True
    # ZeRO-3 / FSDP weight gathers prefetched one unit ahead of the compute (FSDP's prefetch,
    # DeepSpeed's stage3_prefetch_bucket_size); False: each unit is gathered when the pass
    # reaches it and waits for it (DeepSpeed when stage3_max_live_parameters is below a unit's
    # parameters, as in DeepSpeed-Chat's training config: 3e7)
    prefetch_gathers: bool = True
    # What one ZeRO-3 all-gather brings: "layer", FSDP's wrapped unit (a decoder layer); "module",
    # DeepSpeed's parameter coordinator, which fetches each submodule's own parameters in one call
    # (PartitionedParameterCoordinator.fetch_sub_module): a layer's linear projections each,
    # norms and biases below stage3_param_persistence_threshold staying gathered
    gather_unit: GatherUnit = "layer"
    # DeepSpeed's stage3_max_reuse_distance (its default 1e9; DeepSpeed-Chat's configs leave it,
    # OpenRLHF's "auto" falls back to it): with gather_unit "module", a module's gathered
    # parameters stay gathered after a use only if its trace uses them again within this many
    # parameters (PartitionedParameterCoordinator.__params_to_release); read under full recompute
    max_reuse_distance_params: float = Field(default=1e9, ge=0)
    # DeepSpeed's stage3_param_persistence_threshold (its default 1e5; DeepSpeed-Chat's configs
    # 1e4): a parameter of at most this many elements is never partitioned. With gather_unit
    # "module", a module left with two or more partitioned parameters (a weight and a bias above
    # it, or LoRA adapters) is gathered through one flat buffer and copied out of it
    # (LayoutCosts.gather_copy_bytes)
    persistence_threshold_params: float = Field(default=1e5, ge=0)
    # attention kernels: FlashAttention (causal tiles, no score matrix in HBM) or the unfused
    # path of Megatron's core attention (full-square scores, softmax and dropout through HBM)
    attention_kernel: AttentionKernel = "flash"
    # training loop whose per-layer host overhead applies (HardwareProfile.train_layer_overhead_s)
    backend: TrainBackend = "fsdp"
    # Megatron's bias_activation_fusion: the fused (weighted) SwiGLU keeps only its input, 6
    # bytes per unit of MLP width instead of 8 (rlperf.cost.memory_activations); off by default
    # in Megatron-Core and mbridge, on in verl's Megatron example scripts
    fused_activation: bool = False

    @model_validator(mode="after")
    def _check(self) -> TrainLayout:
        if self.pp_schedule == "interleaved" and self.virtual_stages < 2:
            raise ValueError("interleaved schedule needs virtual_stages >= 2")
        if self.pp_schedule != "interleaved" and self.virtual_stages != 1:
            raise ValueError("virtual_stages > 1 needs pp_schedule='interleaved'")
        if self.etp is not None and self.ep == 1 and self.etp != self.tp:
            raise ValueError("etp needs ep > 1 (without expert parallelism experts split like the dense MLP: etp = tp)")
        return self

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard_degree(self) -> int:
        """Ranks over which ZeRO/FSDP shards model states (the data-parallel ranks, incl. cp)."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel degree (``etp``, else ``tp``)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_shards(self) -> int:
        """Ranks one routed expert layer's weights are split over: ``ep x etp``."""
        return self.ep * self.expert_tp

    @property
    def expert_shard_degree(self) -> int:
        """Expert data-parallel ranks over which ZeRO shards expert states: dp·cp·tp / (ep·etp)."""
        return max(1, self.dp * self.cp * self.tp // self.expert_shards)

    @property
    def ulysses(self) -> bool:
        """Context parallelism as DeepSpeed-Ulysses runs it (cp > 1): all-to-alls that trade the
        sequence split for a head split around attention."""
        return self.cp > 1 and self.cp_kind == "ulysses"

    @property
    def ring_attention(self) -> bool:
        """Context parallelism as ring attention runs it (cp > 1): each rank keeps its share of
        the sequence and passes K/V blocks round the cp ring."""
        return self.cp > 1 and self.cp_kind == "ring"

    def expert_grid_error(self) -> str | None:
        """Why ``ep x etp`` cannot tile the stage's dp·cp·tp ranks (None when it can)."""
        ranks = self.dp * self.cp * self.tp
        if ranks % self.expert_shards:
            return f"ep·etp = {self.ep}·{self.expert_tp} does not divide dp·cp·tp = {ranks}"
        return None

    def for_forward_passes(self) -> TrainLayout:
        """This layout as its forward-only passes cut micro-batches (the forward_* fields)."""
        if self.forward_micro_batch_size is None and self.forward_max_tokens_per_microbatch is None:
            return self
        return self.model_copy(update={
            "micro_batch_size": self.forward_micro_batch_size or self.micro_batch_size,
            "max_tokens_per_microbatch": self.forward_max_tokens_per_microbatch or self.max_tokens_per_microbatch,
        })


class EngineLayout(Spec):
    """Layout of a rollout (generation) engine: ``replicas`` independent engines of tp x pp GPUs."""

    tp: Degree = 1
    pp: Degree = 1
    ep: Degree = 1  # expert parallel inside one engine (uses its tp*pp GPUs)
    replicas: NumGpus = 1  # engines: at most one per GPU
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)  # vLLM: weights + KV + activations
    max_num_seqs: NumSequences = 256
    max_num_batched_tokens: NumTokens = 8192  # chunked-prefill token budget per step
    prefix_sharing: bool = True  # a prompt's KV is computed once and shared by its group's samples
    # continuous: vLLM/SGLang (free slots are refilled every step, chunked prefill, preemption);
    # static: fixed batches of max_num_seqs requests in dispatch order, prompts padded to the
    # batch's longest, each batch running until its longest response ends (HF generate,
    # TRT-LLM static micro-batches in NeMo-Aligner, DeepSpeed-Chat's hybrid engine);
    # prefix_sharing and max_num_batched_tokens apply to continuous batching only
    batching: Batching = "continuous"
    # decode steps replayed as CUDA graphs (vLLM/SGLang default); False: eager launches (vLLM
    # enforce_eager), each op dispatched at the profile's eager_op_launch_s (stages.rollout_step)
    cuda_graphs: bool = True
    # the engine prepares step n+1 on the host while the GPU runs step n (SGLang's overlap
    # scheduler, default since v0.4; vLLM's --async-scheduling; TRT-LLM's overlap scheduler): a
    # step takes max(device, host) instead of device + host (stages.rollout_step)
    overlap_scheduling: bool = False
    # data-parallel attention (SGLang --enable-dp-attention with DeepEP, MoE models): each GPU of
    # the replica runs attention and the dense layers whole for its own share of the sequences
    # and keeps only their KV; the routed experts are expert-parallel over the replica (ep =
    # tp * pp, pp = 1) and tokens reach them by an all-to-all dispatch and combine instead of the
    # tp all-reduces (stages.rollout_step)
    dp_attention: bool = False
    # ops one decoder layer dispatches in an eager decode step when the engine is not vLLM's /
    # SGLang's layer (HF generate on a transformers model: 45 for Llama, stages.rollout_step);
    # None: vLLM's structural count
    eager_ops_per_layer: int | None = Field(default=None, ge=1, le=1000)
    # the engine copies every layer's q, k and v weights (and biases) into one fused buffer at
    # each forward before its QKV GEMM: DeepSpeed's hybrid engine under ZeRO-3 (v0.9.0), whose
    # inference containers keep q, k and v apart (set_params_wo_copy), so that
    # DeepSpeedSelfAttention.forward runs _merge_qkv at every decode step (stages.rollout_step)
    qkv_copy_per_forward: bool = False
    dtype: str = "bf16"
    kv_dtype: str = "bf16"

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @model_validator(mode="after")
    def _check(self) -> EngineLayout:
        if self.ep > 1 and self.ep != self.tp * self.pp:
            raise ValueError("ep must equal tp*pp inside one engine (experts spread over the engine's GPUs)")
        if self.dp_attention and (self.pp != 1 or self.ep != self.tp or self.tp < 2):
            raise ValueError("dp_attention needs pp = 1 and ep = tp >= 2 (experts spread over the replica's GPUs)")
        return self


def _divides(field: str, degree: int, what: str, value: int) -> None:
    if value % degree != 0:
        raise SpecError(field, f"{degree} does not divide {what} ({value})")


def _kv_heads(field: str, tp: int, model: ModelSpec) -> None:
    """TP splits KV heads when tp <= num_kv_heads, else replicates each KV head
    tp/num_kv_heads times (Megatron; vLLM's QKVParallelLinear): one must divide the other."""
    kv = model.num_kv_heads
    if model.mla is None and max(tp, kv) % min(tp, kv) != 0:
        raise SpecError(field, f"{tp} GPUs cannot share {model.name}'s {kv} KV heads (neither divides the other)",
                        f"a divisor or a multiple of num_kv_heads ({kv})")


def check_train_layout(model: ModelSpec, layout: TrainLayout, prefix: str = "layout") -> None:
    """Raise SpecError if ``layout`` cannot shard ``model`` (heads, layers, experts)."""
    _kv_heads(f"{prefix}.tp", layout.tp, model)
    _divides(f"{prefix}.tp", layout.tp, "num_heads", model.num_heads)
    if layout.virtual_stages > 1:
        _divides(f"{prefix}.virtual_stages", layout.pp * layout.virtual_stages, "num_layers", model.num_layers)
    if layout.pp > model.num_layers:
        raise SpecError(f"{prefix}.pp", f"{layout.pp} exceeds num_layers ({model.num_layers})")
    if layout.ulysses:
        _divides(f"{prefix}.cp", layout.cp * layout.tp, "num_heads (Ulysses splits heads)", model.num_heads)
    if layout.ep > 1:
        if model.moe is None:
            raise SpecError(f"{prefix}.ep", "expert parallelism needs an MoE model", "1")
        _divides(f"{prefix}.ep", layout.ep, "num_experts", model.moe.num_experts)
        _divides(f"{prefix}.etp", layout.expert_tp, "expert_intermediate_size", model.moe.expert_intermediate_size)
        if layout.dp > 1 and (err := layout.expert_grid_error()):
            raise SpecError(f"{prefix}.ep", err)


def check_engine_layout(model: ModelSpec, layout: EngineLayout, prefix: str = "engine") -> None:
    """Raise SpecError if ``layout`` cannot shard ``model`` in a vLLM-like engine."""
    _kv_heads(f"{prefix}.tp", layout.tp, model)
    _divides(f"{prefix}.tp", layout.tp, "num_heads", model.num_heads)
    if layout.pp > model.num_layers:
        raise SpecError(f"{prefix}.pp", f"{layout.pp} exceeds num_layers ({model.num_layers})")
    if layout.ep > 1:
        if model.moe is None:
            raise SpecError(f"{prefix}.ep", "expert parallelism needs an MoE model", "1")
        _divides(f"{prefix}.ep", layout.ep, "num_experts", model.moe.num_experts)
