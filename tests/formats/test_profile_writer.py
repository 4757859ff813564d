"""ProfileWriter: split parts, write-aside, interrupted captures, schema enforcement; recorder edges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.reader import open_profile
from formats.recorder import ProfileRecorder, record_profile
from formats.validate import validate
from formats.writer import INCOMPLETE_CATEGORY, ProfileWriteError, ProfileWriter, timestamp_text
from neuroncore.events import EventBatch, EventSink
from neuroncore.record_kinds import CcOpMeta, HbmUsageMeta, NeuronLinkUsageMeta, RecordKind
from tests.fixtures.hand_profiles import HW


def hbm_rows(n: int, t0: int = 0) -> dict[str, Any]:
    ts = np.arange(t0, t0 + n, dtype=np.int64) * 1000
    return {"timestamp": ts, "current_throughput": np.full(n, 1e9, np.float32),
            "total_transfer_bytes": np.arange(n, dtype=np.int64) * 1000}


def test_large_table_is_split_into_numbered_parts(tmp_path: Path) -> None:
    out = tmp_path / "p"
    with ProfileWriter(out, HW, row_group_rows=1000, encoder_threads=1) as writer:
        for i in range(20):
            writer.write("HbmUsage", hbm_rows(1000, i * 1000))
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("HbmUsage"))
    assert len(names) == 20 and "HbmUsage.parquet" not in names  # one part per row group
    assert names == sorted(f"HbmUsage_{i}.parquet" for i in range(len(names)))
    profile = open_profile(out)
    table = profile.table("HbmUsage")
    assert table.num_rows == 20_000
    assert table.column("timestamp").to_pylist() == list(range(0, 20_000_000, 1000))  # parts keep order
    assert validate(out).conformant


def test_parallel_lanes_keep_every_row(tmp_path: Path) -> None:
    out = tmp_path / "p"
    with ProfileWriter(out, HW, row_group_rows=500, encoder_threads=2) as writer:
        for i in range(10):
            writer.write("HbmUsage", hbm_rows(700, i * 700))
    profile = open_profile(out)
    assert len(profile.files("HbmUsage")) == 14
    ts = profile.table("HbmUsage").column("timestamp").to_numpy()
    assert np.array_equal(ts, np.arange(7000) * 1000)  # two lanes, parts numbered in order


def test_small_table_gets_the_plain_name_and_memory_stays_one_row_group(tmp_path: Path) -> None:
    out = tmp_path / "p"
    writer = ProfileWriter(out, HW, row_group_rows=1000, encoder_threads=1)
    writer.write("HbmUsage", hbm_rows(2500))
    stream = writer._streams["HbmUsage"]
    assert stream.pending_rows < 1000  # full row groups were handed to the encoder
    assert not out.exists()  # never under its own name until complete
    assert writer.staging == out.parent / "p.incomplete"  # visible, and marked from the start
    running = open_profile(writer.staging)
    assert not running.complete and running.metadata["capture_complete"] is False
    assert writer.close() == out
    assert {p.name for p in out.iterdir()} == {*(f"HbmUsage_{i}.parquet" for i in range(3)),
                                               "Metadata.parquet", "SchemaFields.parquet"}
    assert not writer.staging.exists() and open_profile(out).complete
    with ProfileWriter(tmp_path / "small", HW, row_group_rows=1000) as small:
        small.write("HbmUsage", hbm_rows(900))
    assert {p.name for p in (tmp_path / "small").iterdir()} == {"HbmUsage.parquet", "Metadata.parquet",
                                                               "SchemaFields.parquet"}


@pytest.mark.parametrize("interrupt", [RuntimeError("boom"), KeyboardInterrupt()])
def test_interrupted_capture_is_readable_and_flagged(tmp_path: Path, interrupt: BaseException) -> None:
    out = tmp_path / "p"
    with pytest.raises(type(interrupt)), ProfileWriter(out, HW, row_group_rows=1000) as writer:
        writer.write("HbmUsage", hbm_rows(2500))
        raise interrupt
    assert not out.exists()  # never passed off as whole
    kept = tmp_path / "p.incomplete"
    profile = open_profile(kept)
    assert not profile.complete
    assert profile.metadata["capture_complete"] is False
    assert profile.num_rows("HbmUsage") == 2500
    assert any(w.category == INCOMPLETE_CATEGORY and type(interrupt).__name__ in w.message
               for w in profile.warnings)
    report = validate(kept)
    assert report.conformant and any("interrupted" in f.message for f in report.warnings)


def test_abort_without_hardware_metadata_still_flags_the_profile(tmp_path: Path) -> None:
    writer = ProfileWriter(tmp_path / "p")
    writer.write("HbmUsage", hbm_rows(10))
    kept = writer.abort("stopped by the user")
    assert kept == tmp_path / "p.incomplete"
    assert writer.abort() == kept  # idempotent
    profile = open_profile(kept)
    assert not profile.complete and profile.num_rows("HbmUsage") == 10
    with pytest.raises(RuntimeError, match="aborted"):
        writer.write("HbmUsage", hbm_rows(1))


def test_close_refuses_missing_required_metadata_and_keeps_the_data(tmp_path: Path) -> None:
    writer = ProfileWriter(tmp_path / "p")
    writer.write("HbmUsage", hbm_rows(10))
    with pytest.raises(ProfileWriteError, match="Metadata lacks required"):
        writer.close()
    assert not (tmp_path / "p").exists()
    assert open_profile(tmp_path / "p.incomplete").num_rows("HbmUsage") == 10


def test_existing_target_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    with pytest.raises(FileExistsError):
        ProfileWriter(tmp_path / "p", HW)
    writer = ProfileWriter(tmp_path / "p", HW, overwrite=True)
    writer.write("HbmUsage", hbm_rows(3))
    writer.close()
    assert open_profile(tmp_path / "p").num_rows("HbmUsage") == 3


def test_schema_is_enforced(tmp_path: Path) -> None:
    writer = ProfileWriter(tmp_path / "p", HW)
    with pytest.raises(ProfileWriteError, match="unknown table 'Instructions'"):
        writer.write("Instructions", {})
    with pytest.raises(ProfileWriteError, match="HbmUsage has no column 'bytes'"):
        writer.write("HbmUsage", {**hbm_rows(2), "bytes": [1, 2]})
    with pytest.raises(ProfileWriteError, match="requires column 'current_throughput'"):
        writer.write("HbmUsage", {"timestamp": [1], "total_transfer_bytes": [1]})
    with pytest.raises(ProfileWriteError, match="required but has 1 null"):
        writer.write("HbmUsage", {**hbm_rows(2), "timestamp": [1, None]})
    with pytest.raises(ProfileWriteError, match="cannot store as int64"):
        writer.write("HbmUsage", {**hbm_rows(1), "timestamp": ["soon"]})
    with pytest.raises(ProfileWriteError, match="values, other columns"):
        writer.write("HbmUsage", {**hbm_rows(1), "timestamp": [1, 2]})
    with pytest.raises(ProfileWriteError, match="transient"):
        writer.write("MemoryBandwidthPoint", {"timestamp": [1], "bandwidth_bytes_per_sec": [1.0]})
    with pytest.raises(ProfileWriteError, match="written by the writer itself"):
        writer.write("Metadata", {})
    writer.write_rows("Error", [{"description": "nan", "error_type_id": 3, "timestamp": 5, "type": "Errors"}])
    writer.warn("something odd", "Missing Data")
    writer.close()
    profile = open_profile(tmp_path / "p")
    assert profile.table("Error").column("metadata").null_count == 1
    assert profile.warnings[0].message == "something odd" and profile.complete


def test_timestamp_text() -> None:
    assert timestamp_text(0) == "1970-01-01 00:00:00+00:00"
    assert timestamp_text(1_500_000_000) == "1970-01-01 00:00:01.500000000+00:00"


def test_recorder_takes_cc_ops_links_and_notes_other_cores(tmp_path: Path) -> None:
    sink = EventSink(check=True)
    i64 = np.int64
    with record_profile(tmp_path / "p", sink, core=0, metadata=HW):
        sink.emit(RecordKind.CC_OP, {
            "start_ts": np.array([10, 50], i64), "end_ts": np.array([30, 90], i64),
            "duration_ns": np.array([20, 40], i64), "operation": ["AllReduce", "AllGather"],
            "algorithm": ["Ring", "Mesh"], "num_elements": np.array([1024, 2048], i64),
            "dtype": ["bf16", "bf16"],
            "input_size": np.array([2048, 4096], i64), "output_size": np.array([2048, 8192], i64),
            "algorithm_bandwidth": np.array([1e9, 2e9]), "bus_bandwidth": np.array([1.5e9, 3e9]),
            "trigger_start_ts": np.array([5, 45], i64), "cc_trigger_start_delay": np.array([5, 5], i64),
            "replica_group": ["[[0, 1]]", "[[0, 1]]"], "stream_id": np.zeros(2, i64),
            "stream_index": np.arange(2, dtype=i64)},
            CcOpMeta(execution_id=9, model_id=9, core=0, rank=0, nodes=[4, 7], op_indices=[1, 2],
                     hlo_names=["all-reduce.1", "all-gather.2"]))
        sink.emit(RecordKind.NEURONLINK_USAGE, {
            "timestamp": np.array([0, 1000], i64), "duration_ns": np.array([1000, 1000], i64),
            "channel_id": np.array([3, 3], i64), "channel_kind": ["neuronlink"] * 2, "link_id": [0, 0],
            "src_device": np.array([0, 0], i64), "dst_device": np.array([1, 1], i64),
            "direction": np.zeros(2, np.int32), "transfer_bytes": np.array([4096, 0], i64),
            "current_throughput": np.array([4.096e9, 0.0], np.float32), "active_flows": np.ones(2, np.int32),
            "capacity": np.full(2, 1e11, np.float32)},
            NeuronLinkUsageMeta(topology="ring", execution_ids=[9], channel_labels={3: "link 0 -> 1"}))
        sink.emit(RecordKind.HBM_USAGE, hbm_rows(1), HbmUsageMeta(execution_id=9, model_id=9, core=1))
    profile = open_profile(tmp_path / "p")
    cc = profile.table("CcOp")
    assert cc.column("op_id").to_pylist() == [0, 1]
    assert cc.column("trigger_engine").to_pylist() == ["GpSimd", "GpSimd"]  # written "Pool", read canonical
    assert profile.table("CcOp", normalize_engines=False).column("trigger_engine")[0].as_py() == "Pool"
    assert profile.table("NeuronLinkUsage").column("transfer_bytes").to_pylist() == [4096, 0]
    messages = " ".join(w.message for w in profile.warnings)
    assert "core 1" in messages
    report = validate(tmp_path / "p")
    assert report.conformant
    assert any(f.table == "NeuronLinkUsage" and f.level == "info" for f in report.findings)


def test_recorder_errors_never_reach_the_core(tmp_path: Path) -> None:
    writer = ProfileWriter(tmp_path / "p", HW)
    recorder = ProfileRecorder(writer)
    with pytest.warns(RuntimeWarning, match="recording stopped"):
        recorder(EventBatch(RecordKind.HBM_USAGE, hbm_rows(1), HbmUsageMeta(execution_id=1, model_id=1,
                                                                              core=0)))
    assert recorder.error is not None
    later = EventBatch(RecordKind.HBM_USAGE, hbm_rows(1), HbmUsageMeta(execution_id=2, model_id=1, core=0))
    recorder(later)  # ignored after the failure
    with pytest.raises(RuntimeError, match="recording failed"):
        recorder.close()
    profile = open_profile(tmp_path / "p.incomplete")
    assert not profile.complete and "before the model's program_loaded" in profile.warnings[0].message


def test_written_files_store_plain_types(tmp_path: Path) -> None:
    """Dictionary-encoded strings go to disk as Parquet dictionary pages but read back as strings."""
    with ProfileWriter(tmp_path / "p", HW) as writer:
        writer.write("SemaphoreUpdate", {
            "timestamp": [1, 2], "id": pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int8()), ["7"]),
            "value": np.array([1, 2], np.int16)})
    schema = pq.read_schema(tmp_path / "p" / "SemaphoreUpdate.parquet")
    assert schema.field("id").type == pa.string() and schema.field("value").type == pa.int32()


def test_wide_rows_end_a_row_group_by_bytes(tmp_path: Path) -> None:
    writer = ProfileWriter(tmp_path / "p", HW, row_group_rows=1_000_000, row_group_bytes=10_000,
                           encoder_threads=1)
    for _ in range(5):
        writer.write("StackFrameFileName", {"id": ["1"] * 10, "name": ["x" * 500] * 10})
    assert writer._streams["StackFrameFileName"].pending_bytes < 10_000
    parts = writer.finish_table("StackFrameFileName")
    assert len(parts) >= 2 and sum(pq.ParquetFile(p).metadata.num_rows for p in parts) == 50
    with pytest.raises(ProfileWriteError, match="finish_table"):
        writer.write("StackFrameFileName", {"id": ["2"], "name": ["y"]})
    writer.close()


def test_framework_rollup_gives_up_past_its_span_bound(tmp_path: Path) -> None:
    import neuroncore as nc
    from neuroncore import workloads

    sink = EventSink()
    instance = nc.Instance("trn1.2xlarge", sink=sink)
    program = nc.compile(workloads.get("mlp").graph(), "trn1")
    with record_profile(tmp_path / "p", sink) as recorder:
        recorder._tree.max_spans = 1
        instance.core(0).load(program).execute(timing_only=True)
    profile = open_profile(tmp_path / "p")
    assert not profile.has("FrameworkNode") and profile.num_rows("HloInstruction") > 0
    assert any("FrameworkNode not written" in w.message for w in profile.warnings)


def test_a_null_inside_a_dictionary_is_written_as_a_null_row(tmp_path: Path) -> None:
    """Per-op dictionaries hold a null for ops without the attribute (a traced ``parameter`` has no
    stack frames); Parquet writers refuse such a dictionary, so the writer moves it into the rows."""
    frames = pa.array(["[1, 2]", None, "[3]"], pa.string())
    indices = pa.array(np.array([0, 1, 2, 1, 0], np.int16), mask=np.array([False, False, False, False, True]))
    with ProfileWriter(tmp_path / "p", HW) as writer:
        writer.write("ExecutionInfo", {"execution_index": np.arange(5),
                                       "neff_name": pa.DictionaryArray.from_arrays(indices, frames)})
    layers = open_profile(tmp_path / "p").table("ExecutionInfo").column("neff_name").to_pylist()
    assert layers == ["[1, 2]", None, "[3]", None, None]


def test_a_writer_that_never_finishes_leaves_committed_parts_readable_and_marked(tmp_path: Path) -> None:
    """What a SIGKILL leaves: the writer is simply never closed. Every row group handed on is a
    committed part with its footer, in the visible ``<dir>.incomplete``, marked from the start."""
    writer = ProfileWriter(tmp_path / "p", HW, row_group_rows=100, encoder_threads=2)
    writer.write("HbmUsage", hbm_rows(250))
    for lane in writer._streams["HbmUsage"].lanes:  # the encoder threads finish their parts
        writer._streams["HbmUsage"]._wait(lane)
    left = tmp_path / "p.incomplete"
    assert [p.name for p in tmp_path.iterdir()] == ["p.incomplete"]  # nothing hidden
    profile = open_profile(left)
    assert profile.num_rows("HbmUsage") == 200  # the 50 buffered rows are the unflushed tail
    assert profile.table("HbmUsage").column("timestamp").to_pylist() == list(range(0, 200_000, 1000))
    assert not profile.complete and profile.metadata["capture_complete"] is False
    assert profile.metadata["tensor_engine_num_rows"] == 128  # what was known is in the marks
    assert any(w.category == INCOMPLETE_CATEGORY for w in profile.warnings)
    writer.abort("test over")


def test_a_ctrl_c_while_the_marks_are_written_leaves_no_folder(tmp_path: Path, monkeypatch) -> None:
    """A KeyboardInterrupt inside the constructor (the first marks half written) would otherwise leave
    ``<dir>.incomplete`` holding a Warning alone, with no Metadata to say it is incomplete."""
    real = ProfileWriter._write_file
    calls: list[str] = []

    def interrupted_on_second(self: ProfileWriter, name: str, *args: Any, **kwargs: Any) -> Path:
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(ProfileWriter, "_write_file", interrupted_on_second)
    with pytest.raises(KeyboardInterrupt):
        ProfileWriter(tmp_path / "p", HW)
    assert calls[0] == "Metadata"  # written first: a SIGKILL between the two leaves a marked folder
    assert list(tmp_path.iterdir()) == []
