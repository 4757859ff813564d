"""``python bench/NAME.py`` puts ``bench/`` first on ``sys.path``: a script named like a package we import
shadows it for every bench script (``bench/formats.py`` once made ``python bench/gui.py`` fail at its first
import). The scripts import the installed packages, not a ``sys.path`` of their own making."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.samples import REPO

BENCH = REPO / "bench"


def test_no_bench_script_shadows_an_importable_module(tmp_path: Path) -> None:
    """Asked in a fresh interpreter (this one has test folders on its path and bench scripts loaded as
    modules): which bench script names would import something else if ``bench/`` were not first."""
    stems = sorted(p.stem for p in BENCH.glob("*.py"))
    assert "profile_format" in stems
    probe = f"import importlib.util; print([s for s in {stems!r} if importlib.util.find_spec(s)])"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)


@pytest.mark.parametrize("script", ["gui.py", "profile_format.py", "tui_view.py"])
def test_bench_scripts_start_as_documented(script: str) -> None:
    """``python bench/gui.py --help`` from the repository root: what failed at its first import."""
    done = subprocess.run(
        [sys.executable, f"bench/{script}", "--help"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
