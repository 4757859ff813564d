"""``python bench/NAME.py`` puts ``bench/`` first on ``sys.path``: a script named like a package we import
shadows it for every bench script (``bench/formats.py`` once made ``python bench/gui.py`` fail at its first
import). And the scripts import the installed packages, not a ``sys.path`` of their own making."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.fixtures.samples import REPO

BENCH = REPO / "bench"


def test_no_bench_script_shadows_an_importable_module() -> None:
    stems = sorted(p.stem for p in BENCH.glob("*.py"))
    assert "profile_format" in stems
    shadowing = [s for s in stems if importlib.util.find_spec(s) is not None]
    assert shadowing == []


def test_a_bench_script_imports_our_packages() -> None:
    """What ``python bench/gui.py`` did first: import ``formats`` with ``bench/`` first on the path."""
    probe = "import formats.recorder, formats.synthetic, explorer, collectors, neuroncore; print('ok')"
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(BENCH)!r}); {probe}"],
        capture_output=True, text=True, cwd=BENCH, timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
