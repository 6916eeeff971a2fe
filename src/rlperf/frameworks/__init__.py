"""RL post-training frameworks: import of verl and OpenRLHF configurations into scenarios, and
export of plans back to them."""

from rlperf.frameworks.load import KINDS, load_framework_config, read_overrides
from rlperf.frameworks.openrlhf_export import export_openrlhf
from rlperf.frameworks.openrlhf_import import import_openrlhf
from rlperf.frameworks.report import ExportResult, ImportReport, KeyNote
from rlperf.frameworks.verl_export import export_verl
from rlperf.frameworks.verl_import import import_verl

__all__ = [
    "KINDS",
    "ExportResult",
    "ImportReport",
    "KeyNote",
    "export_openrlhf",
    "export_verl",
    "import_openrlhf",
    "import_verl",
    "load_framework_config",
    "read_overrides",
]
