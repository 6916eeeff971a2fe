"""The runtime's models: a causal LM built from a shipped ``config.json`` (random weights, nothing
downloaded), a critic (the same backbone with a scalar head), and their batched forward passes.

Sequences are stored as token-id lists; a micro-batch is padded when it runs: each sequence
(prompt then response) starts at column 0 and is right-padded to the micro-batch's longest, so
with micro-batches cut from length-sorted sequences the padding is small (HF eager computes it;
the cost model assumes packed sequences, see :attr:`Padded.padded_tokens`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rlperf.errors import SpecError

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str, field: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise SpecError(field, f"the runtime cannot compute in {name!r}", ", ".join(TORCH_DTYPES)) from None


def compute_ctx(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision: fp32 weights, ``dtype`` matmuls (torch.autocast) unless ``dtype`` is fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def config_dict(model: str) -> dict[str, Any]:
    """The ``config.json`` of a catalog name or a path (file or folder)."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        from rlperf.errors import SpecError, show_path
        from rlperf.inputs import load_json

        data = load_json(path, "model")
        if not isinstance(data, dict):
            raise SpecError("<root>", "not a JSON object", "an HF config.json object", show_path(path))
        return data
    from rlperf.catalog import load_config

    return load_config(model)


def hf_config(model: str, **overrides: Any) -> Any:
    """The transformers config of ``model`` with ``overrides`` applied before it is built (so
    derived fields, e.g. per-layer attention types, follow them)."""
    from transformers import AutoConfig

    cfg = {**config_dict(model), **overrides}
    model_type = cfg.pop("model_type", None)
    if model_type is None:
        raise SpecError("model", f"{model!r} has no model_type in its config.json")
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    return AutoConfig.for_model(model_type, **cfg)


# transformers is untyped: its models are ``Any`` here (HF attributes such as ``config``,
# ``generate`` or ``get_decoder`` are not on nn.Module).
HFModel = Any


def from_config(kind: str, config: Any) -> HFModel:
    """``AutoModelForCausalLM`` / ``AutoModel`` ``.from_config``: fp32 weights, SDPA attention."""
    import transformers

    auto: Any = getattr(transformers, kind)
    return auto.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def build_causal_lm(model: str, seed: int, device: torch.device) -> HFModel:
    """A randomly initialized causal LM (seeded), fp32 weights, SDPA attention."""
    torch.manual_seed(seed)
    return from_config("AutoModelForCausalLM", hf_config(model)).to(device)


class Critic(nn.Module):
    """The actor's backbone with a scalar value head (PPO critic, algorithms.md §3.1)."""

    def __init__(self, actor: HFModel) -> None:
        super().__init__()
        cfg = actor.config
        self.backbone: HFModel = from_config("AutoModel", cfg)
        self.backbone.load_state_dict(actor.get_decoder().state_dict())  # initialized from the actor
        self.head = nn.Linear(cfg.hidden_size, 1)
        self.to(next(actor.parameters()).device)


@dataclass(frozen=True)
class Padded:
    """A micro-batch of ``n`` sequences (prompt then response, contiguous), right-padded to the
    longest; response token ``j`` of row ``k`` sits at column ``prompt_len[k] + j``."""

    input_ids: Tensor  # (n, L) int64
    attention_mask: Tensor  # (n, L) int64
    response_ids: Tensor  # (n, R) int64, R = longest response; padding where the mask is 0
    response_mask: Tensor  # (n, R) float32
    predictor_cols: Tensor  # (n, R) int64: the column whose output predicts response token j

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def padded_tokens(self) -> int:
        return int(self.attention_mask.numel())


def pad(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], rows: np.ndarray, pad_id: int, device: torch.device) -> Padded:
    ps = [prompts[i] for i in rows.tolist()]
    rs = [responses[i] for i in rows.tolist()]
    width = max(len(p) + len(r) for p, r in zip(ps, rs))
    r_w = max(len(r) for r in rs)
    n = len(ps)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    resp = torch.full((n, r_w), pad_id, dtype=torch.long)
    rmask = torch.zeros((n, r_w))
    cols = torch.zeros((n, r_w), dtype=torch.long)
    for k, (p, r) in enumerate(zip(ps, rs)):
        ids[k, : len(p) + len(r)] = torch.tensor([*p, *r])
        mask[k, : len(p) + len(r)] = 1
        resp[k, : len(r)] = torch.tensor(r)
        rmask[k, : len(r)] = 1.0
        cols[k] = (len(p) - 1 + torch.arange(r_w)).clamp_max(width - 1)
    return Padded(ids.to(device), mask.to(device), resp.to(device), rmask.to(device), cols.to(device))


def _at_predictors(x: Tensor, b: Padded) -> Tensor:
    """Rows of ``x`` (n, L, ...) at the columns that predict the response tokens: (n, R, ...)."""
    idx = b.predictor_cols
    if x.ndim == 3:
        idx = idx.unsqueeze(-1).expand(-1, -1, x.shape[-1])
    return x.gather(1, idx)


def token_logprobs(lm: HFModel, b: Padded, dtype: torch.dtype) -> Tensor:
    """log pi(y_t | x, y_<t) of every response token, (n, R), fp32. Logits are computed over
    the whole sequence (as verl does) and read at the response positions."""
    with compute_ctx(b.input_ids.device, dtype):
        out = lm(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False)
    logits = _at_predictors(out.logits, b).float()
    logp: Tensor = torch.log_softmax(logits, dim=-1).gather(-1, b.response_ids.unsqueeze(-1)).squeeze(-1)
    return logp


def token_values(critic: Critic, b: Padded, dtype: torch.dtype) -> Tensor:
    """V(state before response token t), (n, R), fp32 (verl: values[:, -R-1:-1])."""
    with compute_ctx(b.input_ids.device, dtype):
        hidden = critic.backbone(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False).last_hidden_state
        values: Tensor = critic.head(_at_predictors(hidden, b)).squeeze(-1)
    return values.float()


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Inference mode for a forward-only pass (no autograd graph), restoring train/eval."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was)
