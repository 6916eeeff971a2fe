"""Test-wide settings.

Hypothesis explores new random examples on every local run (that is how it finds bugs), but CI
runs derandomized: the same examples every time, so a green main stays green and a failure
reproduces. Set HYPOTHESIS_PROFILE=explore to search afresh anywhere.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))
