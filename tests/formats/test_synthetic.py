"""The benchmarks' synthetic profiles (``formats.synthetic``) are valid profiles our readers open, with
the rows asked for, deterministic for a seed: a benchmark never measures a profile we would refuse."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from formats.reader import open_profile
from formats.synthetic import Shape, write_synthetic
from formats.validate import validate


@pytest.mark.parametrize("shape", list(Shape), ids=[s.value for s in Shape])
def test_every_shape_is_a_valid_profile(tmp_path: Path, shape: Shape) -> None:
    flows = shape is Shape.ENGINE_CLOCKS
    write_synthetic(str(tmp_path / "p"), 20_000, shape, chunk=6_000, flows=flows)
    profile = open_profile(tmp_path / "p")
    assert profile.complete and profile.num_rows("Instruction") >= 20_000
    assert profile.num_rows("Summary") == 1 and profile.num_rows("InstructionLod") > 0
    report = validate(tmp_path / "p")
    assert report.conformant, report.errors
    if flows:
        assert profile.num_rows("Flow") >= 20_000
    if shape is Shape.HIERARCHY:
        assert profile.num_rows("FrameworkNode") > 0 and profile.num_rows("HloInstruction") > 0


def test_a_seed_gives_the_same_profile(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_synthetic(str(tmp_path / name), 5_000, Shape.SIDE_BY_SIDE, seed=4, chunk=2_000)
    first = pq.read_table(tmp_path / "a" / "Instruction.parquet")
    second = pq.read_table(tmp_path / "b" / "Instruction.parquet")
    assert first.num_rows == 5_000 and first.equals(second)


def test_flows_only_for_engine_clocks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flows are written for engine-clocks"):
        write_synthetic(str(tmp_path / "p"), 10, Shape.HIERARCHY, flows=True)
    assert not (tmp_path / "p").exists()
