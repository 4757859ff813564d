"""Summary figures of recorded workloads against values computed here, independently, from the core's
own timelines (NumPy over ``ExecutionResult.timeline``), never from the profile's tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from formats import summary
from formats.reader import open_profile
from neuroncore.compiler.program import RES_DMA
from neuroncore.hardware import Engine
from tests.fixtures.recorded import Dataset, Recorded

STEMS = {Engine.TENSOR: "tensor", Engine.VECTOR: "vector", Engine.SCALAR: "scalar", Engine.GPSIMD: "gpsimd",
         Engine.SYNC: "sync"}


def union(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of [start, end): sort, then walk (written here, not formats.intervals)."""
    total, reach, open_start = 0, None, None
    for s, e in sorted(zip(start.tolist(), end.tolist())):
        if reach is None or s > reach:
            if reach is not None:
                total += reach - open_start
            open_start, reach = s, e
        else:
            reach = max(reach, e)
    return total + (reach - open_start if reach is not None else 0)


class Truth:
    """What the core's timelines say, over every execution of a recording."""

    def __init__(self, results: list) -> None:
        starts, ends, engines, opcodes, packets_s, packets_e = [], [], [], [], [], []
        self.flops = self.transpose = self.hbm_read = self.hbm_write = 0
        self.total_ns = 0
        for result in results:
            program, tl = result.program, result.timeline
            nodes = tl.layout.instr_nodes
            starts.append(tl.i_start)
            ends.append(tl.i_end)
            engines.append(program.engine[nodes])
            opcodes.append(np.asarray(program.opcodes, dtype=object)[program.opcode_id[nodes]])
            packets_s.append(tl.packet_start_ns)
            packets_e.append(tl.packet_end_ns)
            self.flops += int(program.raw_flops[nodes].sum() + program.transpose_flops[nodes].sum())
            self.transpose += int(program.transpose_flops[nodes].sum())
            dma = program.resource == RES_DMA
            self.hbm_read += int(program.dma_bytes[dma & (program.hbm_read_bytes > 0)].sum())
            self.hbm_write += int(program.dma_bytes[dma & (program.hbm_write_bytes > 0)].sum())
            self.total_ns += int(result.device_time_ns)
            self.spec = program.spec
        self.start, self.end = np.concatenate(starts), np.concatenate(ends)
        self.engine, self.opcode = np.concatenate(engines), np.concatenate(opcodes)
        self.packet_start, self.packet_end = np.concatenate(packets_s), np.concatenate(packets_e)

    @property
    def peak(self) -> float:
        return 2.0 * self.spec.pe_rows * self.spec.pe_cols * self.spec.pe_clock_hz


def test_summary_matches_the_core_timeline(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    row = summary.stored_summary(profile)
    assert row is not None, "the recorder writes Summary when the capture closes"
    truth = Truth(recorded.results)
    T = truth.total_ns
    assert row["total_time"] == pytest.approx(T * 1e-9, rel=1e-6)
    for engine, stem in STEMS.items():
        mine = truth.engine == int(engine)
        active = union(truth.start[mine], truth.end[mine])
        assert row[f"{stem}_engine_instruction_count"] == int(mine.sum()), stem
        assert row[f"{stem}_engine_instruction_time"] == pytest.approx(
            (truth.end[mine] - truth.start[mine]).sum() * 1e-9, rel=1e-6), stem
        assert row[f"{stem}_engine_active_time"] == pytest.approx(active * 1e-9, rel=1e-6, abs=1e-12), stem
        percent = row[f"{stem}_engine_active_time_percent"]
        assert percent == pytest.approx(active / T, rel=1e-5, abs=1e-9), stem
    dma_active = union(truth.packet_start, truth.packet_end)
    assert row["dma_active_time"] == pytest.approx(dma_active * 1e-9, rel=1e-6)
    assert row["dma_active_time_percent"] == pytest.approx(dma_active / T, rel=1e-5)
    everything = union(np.r_[truth.start, truth.packet_start], np.r_[truth.end, truth.packet_end])
    assert row["total_active_time"] == pytest.approx(everything * 1e-9, rel=1e-6)
    assert row["hardware_flops"] == truth.flops
    assert row["transpose_flops"] == truth.transpose
    assert row["hfu_estimated_percent"] == pytest.approx(truth.flops / (truth.peak * T * 1e-9), rel=1e-5)
    assert row["mfu_estimated_percent"] == pytest.approx(
        (truth.flops - truth.transpose) / (truth.peak * T * 1e-9), rel=1e-5)
    assert (row["hbm_read_bytes"], row["hbm_write_bytes"]) == (truth.hbm_read, truth.hbm_write)
    hbm_bw = truth.spec.hbm_bytes_per_s
    assert row["mbu_estimated_percent"] == pytest.approx(
        (truth.hbm_read + truth.hbm_write) / (T * 1e-9) / hbm_bw, rel=1e-5)
    transfers = int((recorded.program.resource == RES_DMA).sum())
    assert row["dma_transfer_count"] == transfers * len(recorded.results)
    assert row["weight_size_bytes"] == recorded.program.hbm_bytes_by_kind()["weight"]
    assert row["cc_op_count"] == 0 and row["event_count"] == profile.num_rows("SemaphoreUpdate")
    for name, value in row.items():
        if name.endswith("_percent") and value is not None:
            assert 0.0 <= value <= 1.0, name


def test_opcode_summary_and_active_time(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    truth = Truth(recorded.results)
    ops = profile.table("OpcodeSummary", normalize_engines=False).to_pylist()
    assert {r["engine"] for r in ops} <= set(STEMS.values())  # written lowercase (§2.5)
    for r in ops:
        engine = next(e for e, s in STEMS.items() if s == r["engine"])
        mine = (truth.engine == int(engine)) & (truth.opcode == r["opcode"])
        assert r["instruction_count"] == int(mine.sum())
        assert r["instruction_time_ns"] == int((truth.end[mine] - truth.start[mine]).sum())
        assert r["active_time_ns"] == union(truth.start[mine], truth.end[mine])
        assert r["active_time_percent"] == pytest.approx(r["active_time_ns"] / truth.total_ns, rel=1e-5)
    active = profile.table("ActiveTime", normalize_engines=False)
    for engine, stem in STEMS.items():
        rows = active.filter(pc.equal(active.column("engine"), stem))
        s, e = rows.column("start_ts").to_numpy(), rows.column("end_ts").to_numpy()
        order = np.argsort(s)
        assert np.all(s[order][1:] > e[order][:-1]), stem  # merged stretches never touch
        mine = truth.engine == int(engine)
        assert int((e - s).sum()) == union(truth.start[mine], truth.end[mine]), stem


def test_dma_usage_accounts_for_every_byte(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    usage = profile.table("DmaUsage")
    packets = pc.sum(profile.table("DmaPacket", ["transfer_bytes"]).column(0)).as_py()
    assert usage.column("total_transfer_bytes")[-1].as_py() == pytest.approx(packets, abs=usage.num_rows)
    assert pc.min(usage.column("current_throughput")).as_py() >= 0


def test_recomputed_summary_equals_the_stored_one(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    stored = summary.stored_summary(profile)
    fresh = summary.summary_row(profile, recompute=True)
    assert stored is not None
    for name, value in stored.items():
        if name == "total_row_count":
            continue
        if isinstance(value, float):
            assert fresh[name] == pytest.approx(value, rel=1e-6), name  # float32 on disk
        else:
            assert fresh[name] == value, name


def test_framework_and_hlo_rollups(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    truth = Truth(recorded.results)
    nodes = {r["node_name"]: r for r in profile.table("FrameworkNode").to_pylist()}
    roots = [r for r in nodes.values() if r["parent_name"] == ""]
    assert sum(r["raw_flops"] + r["flops_transpose"] for r in roots) == truth.flops
    top = roots[0]
    busy_capacity = truth.peak * top["active_time_ns"] * 1e-9
    assert top["hfu"] == pytest.approx(100 * truth.flops / busy_capacity, rel=1e-3)  # percent, 0-100
    spans = eval_free_intervals(top["time_intervals"])
    assert top["active_time_ns"] == sum(e - s for s, e in spans)
    assert len(top["hfu_per_interval"].strip("[]").split(",")) == len(spans)
    assert top["total_time_tensor"].startswith("[")
    hlo = profile.table("HloInstruction")
    assert pc.sum(hlo.column("instruction_count")).as_py() <= profile.num_rows("Instruction")
    assert pc.sum(pc.add(hlo.column("raw_flops"), hlo.column("flops_transpose"))).as_py() == truth.flops


def eval_free_intervals(text: str) -> list[tuple[int, int]]:
    """Parse ``[[1, 10], [20, 50]]`` without eval (profile content is never evaluated)."""
    numbers = [int(x) for x in text.replace("[", " ").replace("]", " ").replace(",", " ").split()]
    return list(zip(numbers[::2], numbers[1::2]))


def test_collectives_summary_per_rank(tp_dataset: Dataset) -> None:
    result = tp_dataset.result
    for rank, rank_result in enumerate(result.ranks):
        profile = open_profile(next(tp_dataset.root.glob(f"model=*/core={rank_result.core}/execution=1")))
        row = summary.stored_summary(profile)
        assert row is not None
        cc = profile.table("CcOp")
        assert row["cc_op_count"] == cc.num_rows == len(result.collectives), rank
        assert row["cc_op_time"] == pytest.approx(pc.sum(cc.column("duration_ns")).as_py() * 1e-9, rel=1e-6)
        records = result.collectives
        active = union(np.array([c.start_ns for c in records], np.int64),
                       np.array([c.end_ns for c in records], np.int64))
        assert row["cc_op_active_time"] == pytest.approx(active * 1e-9, rel=1e-3)
        assert row["cc_cores_instruction_count"] is None  # CC-core instructions are not recorded
        truth = Truth([rank_result])
        assert row["hardware_flops"] == truth.flops


def test_summaries_are_written_when_a_capture_closes_at_interpreter_exit(tmp_path: Path) -> None:
    """Captures by env var close from atexit, when no thread can start: the summary then runs without
    its prefetch thread, and the profile still gets every derived table."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import atexit, sys
        import neuroncore as nc
        from neuroncore import workloads
        from formats.recorder import ProfileRecorder
        from formats.writer import ProfileWriter
        sink = nc.EventSink()
        recorder = ProfileRecorder(ProfileWriter(sys.argv[1], {"is_simulation": True}))
        sink.subscribe(recorder)
        atexit.register(recorder.close)
        instance = nc.Instance("trn1.2xlarge", sink=sink)
        program = nc.compile(workloads.get("matmul").graph(), "trn1")
        instance.core(0).load(program).execute(timing_only=True)
    """)
    target = tmp_path / "atexit"
    done = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    profile = open_profile(target)
    assert all(profile.num_rows(t) for t in ("Summary", "OpcodeSummary", "ActiveTime", "InstructionLod"))
    assert not profile.warnings
