"""RL post-training frameworks: presets (how each runs a step), the support matrix, import of
verl and OpenRLHF configurations into scenarios, and export of plans back to them."""

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
