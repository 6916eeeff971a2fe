"""Model configs shared by tests (the shape keys of the published Qwen2.5-7B config.json)."""

from __future__ import annotations

from typing import Any

QWEN25_7B_CONFIG: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
