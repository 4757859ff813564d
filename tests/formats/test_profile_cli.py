"""``neuron-profile validate``: exit codes, report contents, one-line errors without tracebacks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.profile_commands import main
from formats.validate import validate
from tests.fixtures.recorded import Recorded


def test_conformant_profile_exits_0(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(recorded.path)]) == 0
    out = capsys.readouterr().out
    assert "conformant: 0 errors" in out and "Instruction" not in out.split("\n")[-2]


def test_json_report(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json", str(recorded.path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["conformant"] is True and report["tables"]["Instruction"] > 0


def test_non_conformant_profile_exits_1(recorded: Recorded, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "bad"
    shutil.copytree(recorded.path, root)
    table = pq.read_table(root / "HbmUsage.parquet")
    table = table.set_column(0, "timestamp", pa.array([str(x) for x in table.column(0).to_pylist()]))
    table = table.drop_columns(["current_throughput"])
    pq.write_table(table, root / "HbmUsage.parquet")
    packets = pq.read_table(root / "DmaPacket.parquet")
    index = packets.schema.get_field_index("queue_type")
    packets = packets.set_column(index, "queue_type", pa.array(["sideways"] * packets.num_rows))
    pq.write_table(packets, root / "DmaPacket.parquet")
    assert main(["validate", "-q", str(root)]) == 1
    out = capsys.readouterr().out
    assert "ERROR   HbmUsage.timestamp: stored as string, schema says int64" in out
    assert "ERROR   HbmUsage.current_throughput: required column missing" in out
    assert "values outside enum DmaQueueType: 'sideways'" in out
    assert "NOT conformant" in out
    report = validate(root)
    assert {(f.table, f.column) for f in report.errors} >= {("HbmUsage", "timestamp"),
                                                            ("DmaPacket", "queue_type")}


def test_findings_on_a_hand_made_profile(tmp_path: Path) -> None:
    root = tmp_path / "p"
    root.mkdir()
    pq.write_table(pa.table({"total_time": pa.array([2e-5], pa.float32()),
                             "dma_active_time_percent": pa.array([28.6], pa.float32())}),
                   root / "Summary.parquet")
    pq.write_table(pa.table({"start_ts": [5], "end_ts": [3], "duration_ns": [1], "engine": ["tensor"],
                             "pcore_idx": [0]}), root / "ActiveTime.parquet")
    pq.write_table(pa.table({"x": [1]}), root / "Mystery.parquet")
    pq.write_table(pa.table({"x": [1]}), root / "bad-name.parquet")
    report = validate(root)
    messages = {(f.level, f.where): f.message for f in report.findings}
    assert ("error", "Metadata") in messages
    assert "fractions" in messages[("warning", "Summary.dma_active_time_percent")]
    assert "end before they start" in messages[("error", "ActiveTime.end_ts")]
    assert ("warning", "ActiveTime.duration_ns") in messages
    assert ("warning", "Mystery") in messages and ("warning", "bad-name.parquet") in messages
    assert ("warning", "SchemaFields") in messages
    assert not report.conformant


@pytest.mark.parametrize("case", ["missing", "corrupt", "empty"])
def test_bad_input_exits_2_with_one_line(recorded: Recorded, tmp_path: Path, case: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / case
    if case == "corrupt":
        shutil.copytree(recorded.path, target)
        data = (target / "Instruction.parquet").read_bytes()
        (target / "Instruction.parquet").write_bytes(data[:100])
    elif case == "empty":
        target.mkdir()
    assert main(["validate", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("neuron-profile: error: ") and "\n" not in err
    assert str(target) in err


def test_bad_schema_file_exits_2(recorded: Recorded, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "schema.json"
    bad.write_text("{}")
    assert main(["validate", "--schema", str(bad), str(recorded.path)]) == 2
    assert "not a usable profile-schema.json" in capsys.readouterr().err


def test_console_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "formats.profile_commands", "validate",
                             str(tmp_path / "none")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
