"""Bad input: a profile with a corrupt table opens with the rest (and a banner), a 0-instruction profile
says so instead of crashing, an unreadable argument among good ones is named, nothing at all is an error."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT

require_gui()


def _bert_copy(tmp_path: Path) -> Path:
    source = next(p.parent for p in BERT.rglob("Instruction.parquet"))
    target = tmp_path / "bert"
    shutil.copytree(source, target)
    return target


def test_corrupt_table_is_left_out_and_named(window_factory: Any, tmp_path: Path) -> None:
    profile = _bert_copy(tmp_path)
    dma = profile / "DmaPacket.parquet"
    dma.write_bytes(dma.read_bytes()[: dma.stat().st_size // 2])
    window = window_factory(profile)
    left_out = "table DmaPacket left out: DmaPacket.parquet unreadable"  # the words view prints
    assert any(left_out in line for line in window.session.banner)
    assert window.banner.isVisible() and "DmaPacket" in window.banner.text()
    kinds = {r.kind for r in window.rows}
    assert "instruction" in kinds and "dma" not in kinds
    assert window.timeline.frame.spans


def test_zero_instruction_profile(window_factory: Any, tmp_path: Path) -> None:
    from formats.writer import ProfileWriter
    from tests.fixtures.hand_profiles import HW

    path = tmp_path / "empty"
    with ProfileWriter(path, HW) as writer:
        writer.write(
            "HbmUsage",
            {
                "timestamp": np.array([0, 1000], np.int64),
                "current_throughput": np.array([0.0, 5.0], np.float32),
                "total_transfer_bytes": np.array([0, 5], np.int64),
            },
        )
    window = window_factory(path)
    assert any("no instructions" in line for line in window.session.banner)
    assert [r.kind for r in window.rows] == ["header", "counter"]
    assert window.timeline.frame is not None
    assert window.hierarchy is not None and "no hierarchy" in window.hierarchy.note
    window.search_panel.text.setText("MATMUL")
    window.search_panel.submit()
    assert window.search_panel.result.total == 0


def test_nothing_drawable_says_so(window_factory: Any, tmp_path: Path) -> None:
    from formats.writer import ProfileWriter
    from tests.fixtures.hand_profiles import HW

    path = tmp_path / "bare"
    with ProfileWriter(path, HW):
        pass
    window = window_factory(path)
    assert [r.kind for r in window.rows] == ["header", "header"]
    assert "nothing to draw" in window.rows[1].label


def test_session_errors(tmp_path: Path) -> None:
    from explorer.gui.session import SessionError, open_session

    with pytest.raises(SessionError, match="no such profile directory"):
        open_session([tmp_path / "missing"])
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(SessionError, match="not a profile"):
        open_session([tmp_path / "junk"])
    session = open_session([BERT, tmp_path / "missing"], connect=False)
    assert len(session.profiles) == 1 and any("missing" in line for line in session.banner)
    assert session.profiles[0].label == "bert-layer"
