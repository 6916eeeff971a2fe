"""Test-wide settings.

Hypothesis explores new random examples on every local run (that is how it finds bugs), but CI
runs derandomized: the same examples every time, so a green main stays green and a failure
reproduces. Set HYPOTHESIS_PROFILE=explore to search afresh anywhere.

No profile has a per-example deadline: the first example that reaches a compiled kernel
(rlperf.stages.jit) pays numba's compile or cache load, seconds on a fresh clone, and a shared
CI machine stretches any timing; speed goals live in bench/, not in tests.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "local"))
