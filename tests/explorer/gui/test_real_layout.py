"""A hand-made profile in the real tool's layout (split parts, mixed engine spellings, no timeline_track,
no derived tables) and one with every counter table: the rows, a click and a region work on both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.hand_profiles import HW
from tests.fixtures.real_layout import real_layout_profile

require_gui()


@pytest.fixture
def real(tmp_path: Path) -> Path:
    return real_layout_profile(tmp_path)


def test_real_layout_rows_click_and_region(window_factory: Any, real: Path) -> None:
    window = window_factory(real)
    labels = [(r.kind, r.label) for r in window.rows]
    assert labels == [
        ("header", "model@latest"),
        ("instruction", "Tensor"),
        ("instruction", "Vector"),
        ("instruction", "GpSimd"),
        ("dma", "qSyncIO0"),
    ]
    tensor = window.rows[1]
    assert sorted(k[2] for k in tensor.keys) == ["PE", "Tensor", "tensor"]  # three spellings, one row
    frame = window.timeline.fetch_now()
    assert int(frame.spans[1].count.sum()) == 3 and int(frame.spans[2].count.sum()) == 2
    window.reveal_instruction(0, 1001, 1010, 1015)
    assert window.details.id == 1001 and window.details_panel.field("opcode") == "MATMUL"
    window.timeline.view.boxed.emit(0.0, 8000.0, 1.0, 2.5)
    summary = window.region_panel.summary
    assert [b.name for b in summary.busy] == ["Tensor", "Vector", "Tensor engine (both rows)"]
    assert summary.busy[0].busy_ns == 15 and summary.busy[1].busy_ns == 10 and summary.busy[2].busy_ns == 15
    assert {o.opcode: o.count for o in summary.opcodes} == {"MATMUL": 5}
    assert window.hierarchy is not None  # rebuilt from the instructions' HLO names
    assert any(n.name == "dot.1" for n in window.hierarchy.nodes)


def test_every_counter_table_gets_a_row(window_factory: Any, tmp_path: Path) -> None:
    from formats.writer import ProfileWriter

    path = tmp_path / "counters"
    ts = np.arange(0, 10_000, 1000, dtype=np.int64)
    n = ts.size
    with ProfileWriter(path, HW) as writer:
        writer.write(
            "HbmUsage",
            {
                "timestamp": ts,
                "current_throughput": np.linspace(0, 9, n).astype(np.float32),
                "total_transfer_bytes": np.arange(n, dtype=np.int64),
            },
        )
        writer.write("PsumUsage", {"timestamp": ts, "avg_util_percent": np.full(n, 0.5, np.float32)})
        writer.write("SbufUsage", {"timestamp": ts, "avg_util_percent": np.full(n, 0.25, np.float32)})
        writer.write("PendingDma", {"timestamp": ts, "value": np.arange(n, dtype=np.int32)})
        writer.write(
            "NeuronLinkUsage",
            {
                "timestamp": ts,
                "duration_ns": np.full(n, 500, np.int64),
                "channel_id": np.full(n, 3, np.int64),
                "channel_kind": pa.array(["neuronlink"] * n),
                "link_id": np.full(n, 1, np.int64),
                "src_device": np.zeros(n, np.int64),
                "dst_device": np.ones(n, np.int64),
                "direction": np.zeros(n, np.int32),
                "transfer_bytes": np.full(n, 100, np.int64),
                "current_throughput": np.full(n, 2e8, np.float32),
            },
        )
    window = window_factory(path)
    counters = [r.label for r in window.rows if r.kind == "counter"]
    assert counters == [
        "HBM throughput",
        "PSUM usage",
        "SBUF usage",
        "Pending DMAs",
        "NeuronLink link 1 dev 0→1 (ch 3)",
    ]
    frame = window.timeline.fetch_now()
    for index, row in enumerate(window.rows):
        if row.kind == "counter":
            assert frame.counters[index].samples == n
    link = next(i for i, r in enumerate(window.rows) if r.label.startswith("NeuronLink"))
    assert frame.counters[link].until is not None  # windowed samples: drawn for their window only
