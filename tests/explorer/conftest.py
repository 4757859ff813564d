"""Fixtures of the explorer tests (terminal viewer, neuron-top, neuron-ls; the GUI's are in gui/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.source_tree import write_source_tree


@pytest.fixture(scope="session")
def source_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``--source-root`` holding the files the viewer tests' profiles record (written now, read only)."""
    return write_source_tree(tmp_path_factory.mktemp("source-root"))
