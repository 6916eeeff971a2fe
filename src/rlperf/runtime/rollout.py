"""Generation for the reference runtime: Hugging Face ``generate`` with a KV cache and sampling,
with every response forced to the length the workload drew for it.

Why force lengths: a randomly initialized model would stop at random; the workload says how
long responses are (long-tailed, with a mass at the cap), and the measured step must follow the
same distribution the simulator is given. :class:`ForcedLength` masks EOS until a request's
drawn length and then allows only EOS; a request drawn at the cap never gets EOS and is
truncated by ``max_new_tokens``, as a real truncated response is. Tokens are otherwise sampled
from the model (temperature 1, no top-k/top-p).

Engine: HF generate runs *static* batches (one call per batch of at most ``max_num_seqs``
requests, in order): prompts are left-padded to the batch's longest, and a finished request
keeps occupying its row (computing padding) until the batch's longest response ends. There is
no continuous batching and no prefix sharing: each of a group's requests prefills its prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
import torch
from torch import Tensor

from rlperf.runtime.models import HFModel, compute_ctx


class ForcedLength:
    """Logits processor: request ``i`` emits exactly ``target[i]`` tokens (EOS last unless it is
    at the cap)."""

    def __init__(self, targets: Sequence[int], prompt_width: int, cap: int, eos: int, device: torch.device) -> None:
        self.target = torch.tensor(list(targets), dtype=torch.long, device=device)
        self.width = prompt_width
        self.cap = cap
        self.eos = eos

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        step = input_ids.shape[1] - self.width  # tokens generated so far
        before = self.target - 1 > step
        at_end = (self.target - 1 == step) & (self.target < self.cap)
        scores[before, self.eos] = float("-inf")
        forced = torch.full_like(scores[at_end], float("-inf"))
        forced[:, self.eos] = 0.0
        scores[at_end] = forced
        return scores


def generate_batch(
    lm: HFModel,
    prompts: Sequence[Sequence[int]],
    targets: Sequence[int],
    cap: int,
    eos: int,
    pad_id: int,
    dtype: torch.dtype,
) -> list[tuple[int, ...]]:
    """Sample responses for one static batch; response ``i`` has ``targets[i]`` tokens."""
    from transformers import LogitsProcessorList

    device = next(lm.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k, p in enumerate(prompts):
        ids[k, width - len(p) :] = torch.tensor(list(p))
        mask[k, width - len(p) :] = 1
    proc = ForcedLength(targets, width, cap, eos, device)
    with torch.no_grad(), compute_ctx(device, dtype):
        out = lm.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=cap,
            eos_token_id=eos,
            pad_token_id=pad_id,
            logits_processor=LogitsProcessorList([proc]),
            use_cache=True,
        )
    gen = out[:, width:].tolist()
    responses = [tuple(int(t) for t in g[:n]) for g, n in zip(gen, targets)]
    for r, n in zip(responses, targets):
        assert len(r) == n, "generate stopped before the forced length"
        assert eos not in r[:-1] and (n == cap or r[-1] == eos), "forced length not honoured"
    return responses
