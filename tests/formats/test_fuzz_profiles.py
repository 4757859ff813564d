"""Generated bad profile folders through every profile tool, with a bounded budget (a few seconds per
entry point): ``bench/fuzz_profiles.py`` runs the same mutations 10,000 times. Nothing may crash
(a traceback, an exit other than 0/1/2, an error that is not one line) or hang."""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.bench_scripts import load_bench
from tests.fixtures.recorded import Recorded

fuzz = load_bench("fuzz_profiles")
MUTATIONS = sorted(name for name in fuzz.MUTATIONS if name != "many_empty")  # 10k files: test_trust
cases = st.tuples(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3), st.integers(0, 2**32))


def _run(entry: str, path: Path, variant: int) -> tuple[str, str]:
    box: list[tuple[str, str]] = []
    thread = threading.Thread(target=lambda: box.append(fuzz.run_entry(entry, path, variant)), daemon=True)
    thread.start()
    thread.join(60)
    return box[0] if box else ("hang", f"{entry} still running after 60 s")


@pytest.mark.parametrize("entry", fuzz.ENTRIES)
def test_generated_bad_profiles(recorded: Recorded, entry: str) -> None:
    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(cases)
    def check(case: tuple[list[str], int]) -> None:
        mutations, seed = case
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "p"
            fuzz.make_case(recorded.path, folder, random.Random(seed), mutations)
            outcome, detail = _run(entry, folder, seed)
            assert outcome in ("ok", "refused"), f"{entry} {'+'.join(mutations)} (seed {seed}): {detail}"

    check()


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_mutation_once_through_every_entry(recorded: Recorded, tmp_path: Path, mutation: str) -> None:
    """Every kind of damage at least once per run, whatever hypothesis draws."""
    folder = tmp_path / "p"
    fuzz.make_case(recorded.path, folder, random.Random(7), [mutation])
    for entry in fuzz.ENTRIES:
        outcome, detail = _run(entry, folder, 0)
        assert outcome in ("ok", "refused"), f"{entry} {mutation}: {detail}"
    shutil.rmtree(folder)
