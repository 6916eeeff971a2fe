"""A small scenario shared by tests: Qwen2.5-0.5B on 8 H100, short responses (simulates in well
under a second)."""

from __future__ import annotations

from typing import Any

SMALL_SCENARIO: dict[str, Any] = {
    "model": "Qwen2.5-0.5B",
    "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 8},
    "workload": {
        "prompts_per_step": 16,
        "group_size": 4,
        "prompt_length": {"kind": "fixed", "tokens": 128},
        "response_length": {"kind": "uniform", "min_tokens": 64, "max_tokens": 512},
    },
    "algorithm": {"name": "GRPO", "minibatches": 2},
    "plan": {"placement": {"kind": "colocated"}, "rollout": {"tp": 1}, "mode": {"kind": "sync"}},
}
