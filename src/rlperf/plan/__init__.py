"""The planner: plan space, fast estimate, search, explanation.

``rlperf.plan(...)`` is the Python API's planning function (:func:`rlperf.api.plan`). Importing a
submodule of this package rebinds the attribute ``rlperf.plan`` to the package, so the package
is made callable too, with the same function: ``rlperf.plan(...)`` works whichever it is.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlperf.api import PlanAnswer


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: object, **kwargs: object) -> PlanAnswer:
        from rlperf.api import plan

        return plan(*args, **kwargs)  # type: ignore[arg-type]


sys.modules[__name__].__class__ = _CallablePackage
