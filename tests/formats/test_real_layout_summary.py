"""A hand-made profile in the real tool's layout (split parts, extra columns, mixed engine spellings, no
optional tables) opens, summarises on demand, queries and exports; a stored Summary is shown as is."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import summary
from formats.profile_commands import main
from formats.query import open_query
from formats.reader import open_profile
from tests.fixtures.perfetto_trace import read_trace
from tests.fixtures.real_layout import real_layout_profile


@pytest.fixture
def real(tmp_path: Path) -> Path:
    """Instruction in two parts ("Tensor"/"tensor"/"PE" then "Vector"/"DVE"/"pool", an extra column in
    one), one DMA packet, Metadata with float64 clocks, nothing else: no Summary, no ExecutionInfo."""
    return real_layout_profile(tmp_path)


def test_summary_on_demand_by_hand(real: Path) -> None:
    row = summary.summary_row(open_profile(real))
    T = 8000e-9  # Metadata first/last_hw_timestamp: 1000 .. 9000 (no ExecutionInfo)
    assert row["total_time"] == pytest.approx(T)
    assert row["tensor_engine_instruction_count"] == 3  # Tensor, tensor, PE
    assert row["tensor_engine_active_time"] == pytest.approx(15e-9)  # 3 x 5 ns, 10 ns apart
    assert row["vector_engine_instruction_count"] == 2 and row["gpsimd_engine_instruction_count"] == 1
    assert row["vector_engine_active_time_percent"] == pytest.approx(10 / 8000)
    assert row["matmul_instruction_count"] == 3  # MATMUL on the Tensor engine only
    assert row["dma_active_time"] == pytest.approx(40e-9) and row["dma_transfer_count"] == 1
    assert row["weight_queue_bytes"] == 64 and row["static_dma_size_percent"] == pytest.approx(1.0)
    # 1000-1005, 1010-1015, 1020-1025 and the packet 1000-1040 overlap: 40 ns; then 5000.. 3 x 5 ns
    assert row["total_active_time"] == pytest.approx(55e-9)
    assert row["total_exec_time"] == pytest.approx((5025 - 1000) * 1e-9)
    assert row["hardware_flops"] is None and row["mfu_estimated_percent"] is None  # no FLOP columns: null
    assert row["cc_op_count"] == 0  # no CcOp table: no collectives ran
    ops = summary.opcode_summary(open_profile(real)).to_pylist()
    found = {(r["engine"], r["instruction_count"]) for r in ops}
    assert found == {("tensor", 3), ("vector", 2), ("gpsimd", 1)}


def test_stored_summary_is_shown_unless_recomputed(real: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # their figures, from the reference's public example (§2.3)
    pq.write_table(pa.table({"total_time": pa.array([2.199e-05], pa.float32()),
                             "dma_active_time": pa.array([6.302e-06], pa.float32()),
                             "dma_active_time_percent": pa.array([0.2865], pa.float32())}),
                   real / "Summary.parquet")
    assert main(["view", str(real), "--output-format", "summary-json"]) == 0
    shown = next(iter(json.loads(capsys.readouterr().out).values()))
    assert shown["total_time"] == pytest.approx(2.199e-05)
    assert shown["dma_active_time_percent"] == pytest.approx(0.2865)
    assert shown["tensor_engine_instruction_count"] is None  # not recomputed over theirs
    assert main(["view", str(real), "--output-format", "summary-json", "--recompute"]) == 0
    fresh = next(iter(json.loads(capsys.readouterr().out).values()))
    assert fresh["total_time"] == pytest.approx(8000e-9) and fresh["tensor_engine_instruction_count"] == 3


def test_queries_and_exports(real: Path, tmp_path: Path) -> None:
    with open_query(real) as q:
        sql = "SELECT engine, count(*), max(kaena_internal_flags) FROM Instruction GROUP BY 1 ORDER BY 1"
        assert q.sql(sql).fetchall() == [("GpSimd", 1, 7), ("Tensor", 3, None), ("Vector", 2, 7)]
        assert q.sql("SELECT count(*) FROM Flow").fetchall() == [(0,)]
    trace = tmp_path / "real.pftrace"
    assert main(["view", str(real), "--output-format", "perfetto", "-o", str(trace)]) == 0
    parsed = read_trace(trace)
    slices = dict(parsed.count())
    assert slices == {"Tensor": 3, "Vector": 2, "GpSimd": 1, "qSyncIO0": 1}
    assert main(["view", str(real), "--output-format", "json", "-o", str(tmp_path / "x.json")]) == 0
    rows = json.loads((tmp_path / "x.json").read_text())["instruction"]
    assert [r["label"] for r in rows] == ["Tensor", "Tensor", "Tensor", "Vector", "Vector", "GpSimd"]
