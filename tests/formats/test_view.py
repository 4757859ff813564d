"""``neuron-profile view``: summary-text, summary-json, legacy json, and a Perfetto trace parsed back."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from formats import summary
from formats.profile_commands import main
from formats.reader import open_profile
from tests.fixtures.perfetto_trace import read_trace
from tests.fixtures.recorded import Dataset, Recorded


def test_formats_only_view_without_output_format_points_at_the_viewer(
        recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(recorded.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "installed neuron-profile opens it" in err and "summary-text" in err
    assert "not built" not in err


def test_summary_json_is_keyed_by_program(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(recorded.path), "--output-format", "summary-json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == [recorded.program.graph.name]  # one key per program, like the real tool
    metrics = next(iter(data.values()))  # how community scripts read it
    stored = summary.stored_summary(open_profile(recorded.path))
    assert stored is not None
    assert set(summary.SUMMARY_COLUMNS) <= set(metrics)
    assert metrics["total_time"] == pytest.approx(stored["total_time"])
    assert 0 < metrics["dma_active_time_percent"] <= 1  # fractions, not percent
    assert metrics["nc_idx"] == 0 and metrics["instance_type"] == "trn1.2xlarge"


def test_summary_json_over_a_folder_has_one_key_per_profile(tp_dataset: Dataset,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(tp_dataset.root), "--output-format", "summary-json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ranks = tp_dataset.result.ranks
    assert sorted(data) == sorted(f"model=llama_decode/core={r.core}/execution=1" for r in ranks)
    assert all(m["cc_op_count"] == len(tp_dataset.result.collectives) for m in data.values())


def test_summary_text(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(recorded.path), "--output-format", "summary-text"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1] for line in out.splitlines()
             if line and not line.startswith(("==", "--"))}
    stored = summary.stored_summary(open_profile(recorded.path))
    assert stored is not None
    assert float(lines["mfu_estimated_percent"]) == pytest.approx(stored["mfu_estimated_percent"], rel=1e-5)
    assert int(lines["tensor_engine_instruction_count"]) == stored["tensor_engine_instruction_count"]
    assert "%)" in out and "µs)" in out and "MiB)" in out  # readable forms (formats.units)


def test_legacy_json(recorded: Recorded, tmp_path: Path) -> None:
    target = tmp_path / "device_profile.json"
    assert main(["view", str(recorded.path), "--output-format", "json", "-o", str(target)]) == 0
    data = json.loads(target.read_text())
    assert list(data) == ["summary", "instruction"] and len(data["summary"]) == 1
    rows = data["instruction"]
    assert len(rows) == recorded.rows("instruction")
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    assert {"timestamp", "duration", "label", "opcode", "operands", "hlo_name", "subgraph"} <= set(rows[0])
    assert "TensorMatrix" in {r["label"] for r in rows}


def test_perfetto_trace_parses_back(recorded: Recorded, tmp_path: Path) -> None:
    target = tmp_path / "bert.pftrace"
    assert main(["view", str(recorded.path), "--output-format", "perfetto", "-o", str(target)]) == 0
    trace = read_trace(target)  # nesting checked per track, as trace_processor needs it
    profile = open_profile(recorded.path)
    instr = profile.table("Instruction", ["timeline_track"]).column(0)
    per_track = dict(zip(*[x.to_pylist() for x in pc.value_counts(instr).flatten()]))
    slices = trace.count()
    for track, count in per_track.items():  # one track per engine row, every instruction a slice
        assert slices[track] == count, track
    packets = profile.table("DmaPacket", ["queue_name", "packet_aggregation_id"])
    groups = _group(packets.column(0).to_pylist(), packets.column(1).to_pylist())
    queues = {q: len(set(ids)) for q, ids in groups.items()}
    for queue, transfers in queues.items():  # one slice per transfer, lanes named "<queue> #n"
        assert sum(n for name, n in slices.items() if name.split(" #")[0] == queue) == transfers, queue
    names = list(trace.names.values())
    engine_rows = [n for n in names if n in per_track]
    queue_rows = [n for n in names if n.split(" #")[0] in queues]
    counter_rows = [n for n in names if n.endswith("(bytes/s)")]
    hierarchy_rows = [n for n in names if n.split(" #")[0] in ("Layers", "HLO ops")]
    assert "Layers" in hierarchy_rows and "HLO ops" in hierarchy_rows
    assert sorted(engine_rows) == sorted(per_track) and len(counter_rows) == 2
    assert len(names) == 1 + len(engine_rows) + len(queue_rows) + len(counter_rows) + len(hierarchy_rows)
    assert all(s.depth == 0 for s in trace.slices if not s.track.startswith("Layers"))  # lanes: no overlap
    ops = sum(slices[n] for n in hierarchy_rows if n.startswith("HLO ops"))
    assert ops == profile.num_rows("HloInstruction")
    assert trace.counters["HBM throughput (bytes/s)"] == profile.num_rows("HbmUsage")
    assert trace.counters["DMA throughput (bytes/s)"] == profile.num_rows("DmaUsage")


def test_perfetto_over_a_folder_has_a_process_per_profile(tp_dataset: Dataset, tmp_path: Path) -> None:
    target = tmp_path / "tp.pftrace"
    assert main(["view", str(tp_dataset.root), "--output-format", "perfetto", "-o", str(target)]) == 0
    trace = read_trace(target)
    processes = [n for u, n in trace.names.items() if not trace.parents[u]]
    assert sorted(processes) == sorted(f"model=llama_decode/core={r.core}/execution=1"
                                       for r in tp_dataset.result.ranks)
    cc = [n for n in trace.count() if n.startswith("CC stream")]
    assert sum(trace.count()[n] for n in cc) == 2 * len(tp_dataset.result.collectives)


def _group(keys: list[str], values: list[int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for k, v in zip(keys, values):
        out.setdefault(k, []).append(v)
    return out


def test_system_profiles_are_left_to_query(recorded: Recorded, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A capture folder holds device/ and system/; the summary views show the device profiles."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(recorded.path, tmp_path / "run" / "device" / "model=bert" / "core=0" / "execution=1")
    system = tmp_path / "run" / "system"
    system.mkdir()
    pq.write_table(pa.table({"timestamp": [1], "util_percent": pa.array([0.5], pa.float32()), "cpu_id": ["0"],
                             "instance_id": ["i-0"]}), system / "CpuUsage.parquet")
    assert main(["view", str(tmp_path / "run"), "--output-format", "summary-json"]) == 0
    captured = capsys.readouterr()
    assert list(json.loads(captured.out)) == ["device/model=bert/core=0/execution=1"]
    assert "system profile" in captured.err
    assert main(["view", str(system), "--output-format", "summary-text"]) == 2
    assert main(["query", str(tmp_path / "run"), "SELECT profile, cpu_id FROM CpuUsage"]) == 0
    assert "system" in capsys.readouterr().out
