"""The reader on a hand-made profile in the real Neuron Explorer's layout, and on every kind of bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.reader import ProfileError, open_profile
from formats.schema import SCHEMA
from tests.fixtures.real_layout import instruction_part, metadata_row, real_layout_profile
from tests.fixtures.recorded import Recorded


@pytest.fixture
def real_layout(tmp_path: Path) -> Path:
    """The minimal real-layout profile with strays: split Instruction with mixed engine spellings and an
    extra column, ActiveTime, a prefix-sharing unknown neighbour table, a text file; no SchemaFields and
    no optional tables (no CcOp, no Flow ...)."""
    return real_layout_profile(tmp_path, strays=True)


def test_real_tool_layout_opens(real_layout: Path) -> None:
    profile = open_profile(real_layout)
    assert profile.version == "7.4.0" and profile.complete and not profile.is_simulation
    parts = [p.name for p in profile.files("Instruction")]
    assert parts == ["Instruction_0.parquet", "Instruction_1.parquet"]
    instr = profile.table("Instruction")
    assert instr.num_rows == 6
    assert instr.column("engine").to_pylist() == ["Tensor", "Tensor", "Tensor", "Vector", "Vector", "GpSimd"]
    assert instr.column("kaena_internal_flags").to_pylist() == [None, None, None, 7, 7, 7]
    assert instr.column("timeline_track").null_count == 6  # optional column absent from the files
    assert instr.schema.names[:55] == SCHEMA.tables["Instruction"].names
    raw = profile.table("Instruction", ["engine"], normalize_engines=False)
    assert raw.column("engine").to_pylist()[:3] == ["Tensor", "tensor", "PE"]
    assert profile.table("ActiveTime").column("engine").to_pylist() == ["Tensor"]
    # the DmaPacket glob pitfall: DmaPacketAggregatedDebug is its own (unknown) table
    assert profile.num_rows("DmaPacket") == 1
    assert not profile.tables["DmaPacketAggregatedDebug"].known
    assert any("DmaPacketAggregatedDebug" in note for note in profile.notes)
    # a missing table is an empty table with the documented columns
    cc = profile.table("CcOp")
    assert cc.num_rows == 0 and cc.schema.names == SCHEMA.tables["CcOp"].names
    assert profile.files("CcOp") == [] and profile.dataset("Flow").to_table().num_rows == 0
    # widths: real int32 where we say int64 is widened, float64 clocks kept exact
    meta = profile.metadata
    assert meta["tensor_engine_clock_freq"] == 2.8 and meta.get("capture_complete") is None
    assert profile.dataset("Instruction").to_table(columns=["id"]).num_rows == 6


def test_streaming_and_column_selection(real_layout: Path) -> None:
    profile = open_profile(real_layout)
    batches = list(profile.iter_batches("Instruction", ["id", "engine"], batch_size=2))
    assert sum(b.num_rows for b in batches) == 6 and batches[0].schema.names == ["id", "engine"]
    with pytest.raises(ProfileError, match="no column 'nope'"):
        profile.table("Instruction", ["nope"])


def one_line(exc: pytest.ExceptionInfo[ProfileError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_missing_directory_and_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as exc:
        open_profile(tmp_path / "nowhere")
    assert "no such profile directory" in one_line(exc)
    (tmp_path / "file.parquet").write_bytes(b"x")
    with pytest.raises(ProfileError, match="not a profile directory"):
        open_profile(tmp_path / "file.parquet")


def test_not_a_profile(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match=r"no <Table>\.parquet files"):
        open_profile(tmp_path / "empty")
    (tmp_path / "other").mkdir()
    pq.write_table(pa.table({"a": [1]}), tmp_path / "other" / "sales.parquet")
    with pytest.raises(ProfileError, match="none of its Parquet files is a profile table"):
        open_profile(tmp_path / "other")


def copy_profile(recorded: Recorded, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(recorded.path, target)
    return target


def test_truncated_parquet_names_the_file(recorded: Recorded, tmp_path: Path) -> None:
    root = copy_profile(recorded, tmp_path)
    data = (root / "Instruction.parquet").read_bytes()
    (root / "Instruction.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ProfileError) as exc:
        open_profile(root)
    assert "Instruction.parquet" in one_line(exc) and "truncated or corrupt" in str(exc.value)


def test_corrupt_parquet_names_the_file(recorded: Recorded, tmp_path: Path) -> None:
    root = copy_profile(recorded, tmp_path)
    (root / "DmaPacket.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 50 + b"PAR1")
    with pytest.raises(ProfileError) as exc:
        open_profile(root)
    assert "DmaPacket.parquet" in one_line(exc)


def test_corrupt_pages_fail_on_read_with_the_file_name(recorded: Recorded, tmp_path: Path) -> None:
    root = copy_profile(recorded, tmp_path)
    path = root / "Instruction.parquet"
    data = bytearray(path.read_bytes())
    for i in range(8, len(data) // 2, 7):  # scribble over column data, leave the footer intact
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    profile = open_profile(root)
    with pytest.raises(ProfileError) as exc:
        profile.table("Instruction")
    assert "Instruction.parquet" in one_line(exc) and "cannot read table Instruction" in str(exc.value)


def test_missing_required_column(real_layout: Path) -> None:
    pq.write_table(instruction_part(["Tensor"], 0, False).drop_columns(["opcode"]),
                   real_layout / "Instruction_1.parquet")
    with pytest.raises(ProfileError) as exc:
        open_profile(real_layout)
    assert "Instruction_1.parquet" in one_line(exc) and "required column 'opcode'" in str(exc.value)


def test_wrong_column_type(real_layout: Path) -> None:
    part = instruction_part(["Tensor"], 0, False)
    part = part.set_column(part.schema.get_field_index("start_ts"), "start_ts", pa.array(["early"]))
    pq.write_table(part, real_layout / "Instruction_0.parquet")
    with pytest.raises(ProfileError) as exc:
        open_profile(real_layout)
    assert "Instruction.start_ts is string, expected int64" in one_line(exc)


def test_newer_major_version_is_refused_naming_both(real_layout: Path) -> None:
    pq.write_table(metadata_row("12.0.1"), real_layout / "Metadata.parquet")
    with pytest.raises(ProfileError) as exc:
        open_profile(real_layout)
    assert "12.0.1" in one_line(exc) and "7.4.0" in str(exc.value)


def test_minor_versions_and_older_majors_are_read(real_layout: Path) -> None:
    pq.write_table(metadata_row("7.9.2"), real_layout / "Metadata.parquet")
    assert open_profile(real_layout).version == "7.9.2"
    pq.write_table(metadata_row("6.1.0"), real_layout / "Metadata.parquet")
    assert any("older" in n for n in open_profile(real_layout).notes)
    pq.write_table(metadata_row("latest"), real_layout / "Metadata.parquet")
    with pytest.raises(ProfileError, match=r"not a MAJOR\.MINOR\.PATCH"):
        open_profile(real_layout)


def test_profile_without_metadata_opens_with_a_note(real_layout: Path) -> None:
    (real_layout / "Metadata.parquet").unlink()
    profile = open_profile(real_layout)
    assert profile.version is None and any("no Metadata" in n for n in profile.notes)
