"""RL post-training frameworks: presets (how each runs a step), the support matrix, import of
verl and OpenRLHF configurations into scenarios, and export of plans back to them.

The names below load their module on first use (PEP 562): ``rlperf plan`` reads the presets
on every question, and importing the four config importers and exporters with them cost about
a twentieth of a second of each command that never reads a config."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlperf.frameworks.load import KINDS, load_framework_config, read_overrides
    from rlperf.frameworks.openrlhf_export import export_openrlhf
    from rlperf.frameworks.openrlhf_import import import_openrlhf
    from rlperf.frameworks.presets import (
        STRATEGIES,
        FrameworkPreset,
        PlanDefaults,
        Support,
        get_framework,
        list_frameworks,
        register_framework,
    )
    from rlperf.frameworks.report import ExportResult, ImportReport, KeyNote
    from rlperf.frameworks.verl_export import export_verl
    from rlperf.frameworks.verl_import import import_verl

# Each public name -> the module that defines it.
_MODULE_OF = {
    "KINDS": "load", "load_framework_config": "load", "read_overrides": "load",
    "export_openrlhf": "openrlhf_export", "import_openrlhf": "openrlhf_import",
    "STRATEGIES": "presets", "FrameworkPreset": "presets", "PlanDefaults": "presets", "Support": "presets",
    "get_framework": "presets", "list_frameworks": "presets", "register_framework": "presets",
    "ExportResult": "report", "ImportReport": "report", "KeyNote": "report",
    "export_verl": "verl_export", "import_verl": "verl_import",
}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "KINDS",
    "STRATEGIES",
    "ExportResult",
    "FrameworkPreset",
    "ImportReport",
    "KeyNote",
    "PlanDefaults",
    "Support",
    "export_openrlhf",
    "export_verl",
    "get_framework",
    "import_openrlhf",
    "import_verl",
    "list_frameworks",
    "load_framework_config",
    "read_overrides",
    "register_framework",
]
