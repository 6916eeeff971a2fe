"""Strict typing and lint of the package, checked in CI (pinned tool versions in the test extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (it is in the test extra)")
    return found


def test_mypy_strict_passes_on_the_package() -> None:
    out = subprocess.run([_tool("mypy"), "src"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]


def test_ruff_passes() -> None:
    out = subprocess.run([_tool("ruff"), "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:]
