"""docs/frameworks.md embeds the support matrix as the presets produce it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlperf.frameworks.presets import matrix_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "frameworks.md"


@pytest.mark.skipif(not DOC.exists(), reason="docs are not installed with the package")
def test_doc_matrix_is_current() -> None:
    assert matrix_markdown() in DOC.read_text()
