"""Numeric formats and their sizes."""

from __future__ import annotations

from typing import Literal

DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4"]

BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "fp4": 0.5,
}


def bytes_per(dtype: str) -> float:
    from rlperf.errors import SpecError

    try:
        return BYTES_PER_ELEMENT[dtype]
    except KeyError:
        raise SpecError("dtype", f"unknown dtype {dtype!r}", ", ".join(BYTES_PER_ELEMENT)) from None
