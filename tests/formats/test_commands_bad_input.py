"""Every bad-input case through ``neuron-profile query`` and ``view``: one line naming the file, table or
column on stderr, exit 2, no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.profile_commands import main
from tests.fixtures.real_layout import metadata_row
from tests.fixtures.recorded import Recorded


def missing(root: Path) -> tuple[Path, str]:
    return root.with_name("nowhere"), "no such profile directory"


def not_a_profile(root: Path) -> tuple[Path, str]:
    other = root.with_name("sales")
    other.mkdir()
    pq.write_table(pa.table({"a": [1]}), other / "sales.parquet")
    return other, "not a profile"


def truncated(root: Path) -> tuple[Path, str]:
    data = (root / "Instruction.parquet").read_bytes()
    (root / "Instruction.parquet").write_bytes(data[: len(data) // 2])
    return root, "Instruction.parquet"


def corrupt_pages(root: Path) -> tuple[Path, str]:
    path = root / "Instruction.parquet"
    data = bytearray(path.read_bytes())
    for i in range(8, len(data) // 2, 7):  # column data scribbled over, footer intact
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return root, "Instruction.parquet"


def missing_required_column(root: Path) -> tuple[Path, str]:
    pq.write_table(pq.read_table(root / "DmaPacket.parquet").drop_columns(["transfer_bytes"]),
                   root / "DmaPacket.parquet")
    return root, "'transfer_bytes'"


def wrong_type(root: Path) -> tuple[Path, str]:
    table = pq.read_table(root / "HbmUsage.parquet")
    index = table.schema.get_field_index("timestamp")
    table = table.set_column(index, "timestamp", pa.array([str(x) for x in table.column(index).to_pylist()]))
    pq.write_table(table, root / "HbmUsage.parquet")
    return root, "HbmUsage.timestamp"


def newer_major(root: Path) -> tuple[Path, str]:
    pq.write_table(metadata_row("12.0.1"), root / "Metadata.parquet")
    return root, "12.0.1"


CASES: list[Callable[[Path], tuple[Path, str]]] = [missing, not_a_profile, truncated, corrupt_pages,
                                                   missing_required_column, wrong_type, newer_major]
COMMANDS = {
    "query": lambda d, tmp: ["query", str(d), "SELECT engine, sum(duration_ns) FROM Instruction GROUP BY 1"],
    "summary": lambda d, tmp: ["view", str(d), "--output-format", "summary-json", "--recompute"],
    "perfetto": lambda d, tmp: ["view", str(d), "--output-format", "perfetto", "-o", str(tmp / "t.pftrace")],
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_profiles(recorded: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      case: Callable[[Path], tuple[Path, str]], command: str) -> None:
    root = tmp_path / "copy"
    shutil.copytree(recorded.path, root)
    target, words = case(root)
    assert main(COMMANDS[command](target, tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("neuron-profile: error: "), err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "t.pftrace").exists() and not (tmp_path / "t.pftrace.partial").exists()


@pytest.mark.parametrize("sql, words", [("SELECT * FROM Nope", "Nope"),
                                        ("SELECT start_tss FROM Instruction", "start_tss"),
                                        ("DELETE FROM Instruction", "read-only"),
                                        ("INSERT INTO Instruction SELECT * FROM Instruction", "read-only")])
def test_sql_errors_and_writes(recorded: Recorded, capsys: pytest.CaptureFixture[str], sql: str,
                               words: str) -> None:
    assert main(["query", str(recorded.path), sql]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_no_traceback_from_the_console_script(tmp_path: Path) -> None:
    """The real entry point (explorer.profile_cli assembles the formats' commands)."""
    for argv in (["query", str(tmp_path / "nowhere"), "SELECT 1"],
                 ["view", str(tmp_path / "nowhere"), "--output-format", "summary-text"]):
        done = subprocess.run([sys.executable, "-m", "explorer.profile_cli", *argv], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "no such profile directory" in done.stderr


def test_legacy_json_needs_one_profile(tmp_path: Path, recorded: Recorded,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):
        shutil.copytree(recorded.path, tmp_path / "runs" / f"rank={name}")
    assert main(["view", str(tmp_path / "runs"), "--output-format", "json"]) == 2
    assert "holds 2 profiles" in capsys.readouterr().err


def test_parquet_output_needs_a_file(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", str(recorded.path), "SELECT 1", "--format", "parquet"]) == 2
    assert "-o FILE" in capsys.readouterr().err


