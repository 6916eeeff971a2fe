"""Base for all specs: frozen, keyword-only, no unknown fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """A frozen, validated value object. Unknown fields are rejected (typos are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)
