"""Zoomed-out rows show how busy each pixel is (issue 12 §2): a 30 %-busy engine never looks solid,
and the Tensor engine's two rows say what they run, with the engine's union (the Summary's "Tensor")
drawn next to them. Both failed before: every non-empty pixel was painted full height."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT

require_gui()


def _thirty_percent(path: Path) -> Path:
    from formats.writer import ProfileWriter
    from tests.fixtures.hand_profiles import HW

    n = 100_000
    start = np.arange(n, dtype=np.int64) * 1000
    end = start + 300
    with ProfileWriter(path, HW) as writer:
        writer.write("Instruction", {
            "start_ts": start, "end_ts": end, "duration_ns": end - start,
            "engine": pa.array(["Vector"] * n), "timeline_track": pa.array(["Vector"] * n),
            "opcode": pa.array(["TENSOR_COPY"] * n), "operands": pa.array([""] * n),
            "id": np.arange(n, dtype=np.int64), "pc": np.arange(n, dtype=np.int64),
            "bir_id": pa.array(["sg0000:0"] * n),
        })
    return path


def _painted_share(window: Any, index: int) -> np.ndarray:
    """Per column, the share of the row's band (inside its padding) not painted background."""
    picture = window.timeline.picture
    slot = picture.rows.index(index)
    band = picture.image[slot * picture.row_px + 2 : (slot + 1) * picture.row_px - 2]
    background = {(255, 255, 255, 255), (246, 247, 250, 255)}
    flat = band.reshape(-1, 4)
    painted = np.array([tuple(c) not in background for c in flat.tolist()]).reshape(band.shape[:2])
    return painted.mean(axis=0)


def test_a_thirty_percent_busy_engine_is_never_solid(window_factory: Any, tmp_path: Path) -> None:
    window = window_factory(_thirty_percent(tmp_path / "p"))
    index = next(i for i, r in enumerate(window.rows) if r.label == "Vector")
    for zoom, slack in ((1.0, 0.06), (0.02, 0.11)):  # the level of detail, then the events (1.5 periods/px)
        window.timeline.fit()
        window.timeline.zoom(zoom)
        frame = window.timeline.fetch_now()
        request = frame.request
        pixel = (request.t1 - request.t0) / request.buckets
        columns = request.t0 + np.arange(request.buckets) * pixel
        lo, hi = window.timeline.span
        inside = (columns >= lo + 2 * pixel) & (columns + pixel <= hi - 2 * pixel)  # the frame has margins
        busy = frame.spans[index].busy
        assert busy is not None and np.all(np.abs(busy[inside] - 0.3) < slack), frame.sources[index]
        share = _painted_share(window, index)[inside]
        assert 0.15 < share.mean() < 0.45, share.mean()
        assert share.max() < 0.6


def test_tensor_rows_say_what_they_run_and_the_union_is_drawn(window_factory: Any) -> None:
    from explorer.gui.rows import ACTIVE
    from formats.figures import engine_busy, whole

    window = window_factory(BERT)
    titles = [r.shown for r in window.rows]
    assert "Tensor · LoadStationary" in titles and "TensorMatrix · MATMUL" in titles
    union = next(i for i, r in enumerate(window.rows) if r.kind == ACTIVE)
    assert window.rows[union].shown == "Tensor engine = both rows"
    assert window.rows[union - 1].track == "TensorMatrix"
    labels = [window.timeline._row_label(window.rows[i]) for i in window.timeline.visible_rows()]
    assert "Tensor · LoadStationary" in labels
    window.timeline.fit()
    frame = window.timeline.fetch_now()
    lo, hi = frame.request.t0, frame.request.t1
    pixel = (hi - lo) / frame.request.buckets
    tensor = [i for i, r in enumerate(window.rows) if r.engine == "Tensor"]
    drawn = frame.spans[union].busy
    assert drawn is not None
    for i in tensor:  # the union covers each of its rows
        assert drawn.sum() >= frame.spans[i].busy.sum() - 1e-6
    expected = engine_busy(window.session.profiles[0].profile, whole(window.session.profiles[0].profile))
    assert drawn.sum() * pixel == pytest.approx(expected["Tensor"].busy_ns, rel=0.02)
    # clicking the union row tells what it is
    ref = None
    for column in np.flatnonzero(drawn > 0.5):
        ref = window.timeline.event_at(lo + (column + 0.5) * pixel, union + 0.5)
        if ref is not None:
            break
    assert ref is not None
    window.timeline.event_clicked.emit(ref)
    assert window.details is not None and "LoadStationary ∪ MATMUL" in window.details.title


def test_summary_tab_shows_the_figures_every_view_shows(window_factory: Any) -> None:
    """The Summary tab prints ``formats.figures`` of the whole execution (scanned here from the
    events, there read from the Summary row) with ``formats.units``: one figure, one definition."""
    from explorer.gui.compare import METRICS, format_value
    from formats.figures import figures, whole

    window = window_factory(BERT)
    profile = window.session.profiles[0].profile
    scanned = figures(profile, whole(profile))
    table = window.summary_table
    shown = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    checked = 0
    for metric in METRICS:
        value = metric.value(scanned)
        if value is None or not metric.listed:
            continue
        expected = metric.text(scanned) if metric.text else format_value(value, metric.unit)
        assert shown[metric.label] == expected, metric.label
        checked += 1
    assert checked >= 20
    assert shown["HBM read"] != "0 B" and shown["Tensor active (both rows)"].endswith("%")
    # the DMA count as the headline and the terminal viewer print it: transfers and packets
    assert shown["DMA transfers"] == scanned.dma.count_text
    assert shown["DMA transfers"].endswith(" packets)") and "DMA packets" not in shown
