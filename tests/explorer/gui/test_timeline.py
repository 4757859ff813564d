"""The main window on real (sample) profiles: opening, rows, zoom and pan, clicking an instruction,
box-select summaries checked against DuckDB, colour modes, hierarchy and source highlights."""

from __future__ import annotations

import itertools
from typing import Any

import duckdb
import numpy as np
import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT, LLAMA_TP2

require_gui()
from PySide6.QtCore import QPointF, Qt  # noqa: E402 (after the skip)


def _sql(profile: Any, table: str) -> str:
    from formats.sqlsource import TableSource

    return TableSource(profile, table).relation()


def _row_index(window: Any, label: str, profile: int = 0) -> int:
    return next(
        i
        for i, r in enumerate(window.rows)
        if r.label == label and r.profile == profile and r.kind != "header"
    )


def _drawn_column(window: Any, row: int) -> tuple[int, int]:
    """(column, event index) in the middle of the widest event drawn in ``row``."""
    picture = window.timeline.picture
    owner = picture.owners[picture.rows.index(row)].index
    runs = np.flatnonzero(np.diff(np.r_[-1, owner, -1]) != 0)
    best = max(((a, b) for a, b in itertools.pairwise(runs) if owner[a] >= 0), key=lambda ab: ab[1] - ab[0])
    column = (best[0] + best[1]) // 2
    return column, int(owner[column])


def _click(qtbot: Any, window: Any, t: float, row: int) -> None:
    timeline = window.timeline
    scene = timeline.view.mapViewToScene(QPointF(t, row + 0.5))
    point = timeline.plot.mapFromScene(scene)
    qtbot.mouseClick(timeline.plot.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_opens_a_capture_grouped_per_core(window_factory: Any) -> None:
    window = window_factory(LLAMA_TP2)
    headers = [r.label for r in window.rows if r.kind == "header"]
    assert headers == ["core 0", "core 1"]
    labels = [r.label for r in window.rows if r.profile == 0]
    for expected in (
        "Tensor",
        "TensorMatrix",
        "Vector",
        "Scalar",
        "GpSimd",
        "Sync",
        "CC stream 0",
        "HBM throughput",
        "DMA throughput",
    ):
        assert expected in labels
    assert any(label.startswith("q") for label in labels)  # DMA queues
    assert any("ch 64" in label for label in labels)  # NeuronLink / on-chip channel counter
    frame = window.timeline.frame
    assert frame is not None and not frame.pending
    drawn = sum(len(w) for w in frame.spans.values()) + sum(len(w) for w in frame.counters.values())
    assert 0 < drawn <= 50_000
    assert all(len(w) <= frame.request.buckets for w in frame.spans.values())
    assert window.hierarchy is not None and window.hierarchy.nodes
    assert window.summary_table.rowCount() > 5


def test_keys_zoom_and_pan(window_factory: Any) -> None:
    window = window_factory(BERT)
    timeline = window.timeline
    x0, x1 = timeline.time_range()
    assert timeline.handle_key(Qt.Key.Key_W)
    a0, a1 = timeline.time_range()
    assert (a1 - a0) == pytest.approx((x1 - x0) * 0.7, rel=1e-6)
    assert (a0 + a1) / 2 == pytest.approx((x0 + x1) / 2, rel=1e-6)
    timeline.handle_key(Qt.Key.Key_D)
    b0, _ = timeline.time_range()
    assert b0 - a0 == pytest.approx(0.2 * (a1 - a0), rel=1e-6)
    timeline.handle_key(Qt.Key.Key_A)
    timeline.handle_key(Qt.Key.Key_S)
    c0, c1 = timeline.time_range()
    assert (c1 - c0) == pytest.approx(x1 - x0, rel=1e-6)
    for _ in range(12):
        timeline.handle_key(Qt.Key.Key_W)
    frame = timeline.fetch_now()
    t0, t1 = timeline.time_range()
    assert frame.request.t0 <= t0 and t1 <= frame.request.t1
    assert all(w.source == "events" for w in frame.spans.values())  # zoomed in: read from the events
    timeline.handle_key(Qt.Key.Key_F)
    assert timeline.time_range() == pytest.approx(timeline.span)


def test_wheel_zooms_around_the_cursor(window_factory: Any, qtbot: Any) -> None:
    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    window = window_factory(BERT)
    timeline = window.timeline
    x0, x1 = timeline.time_range()
    viewport = timeline.plot.viewport()
    center = viewport.rect().center()
    event = QWheelEvent(
        QPointF(center),
        QPointF(viewport.mapToGlobal(center)),
        QPoint(0, 0),
        QPoint(0, 240),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(viewport, event)
    a0, a1 = timeline.time_range()
    assert a1 - a0 < x1 - x0


def test_clicking_an_instruction_shows_its_details(window_factory: Any, qtbot: Any) -> None:
    window = window_factory(BERT)
    row = _row_index(window, "Vector")
    column, k = _drawn_column(window, row)
    picture = window.timeline.picture
    t = picture.t0 + (column + 0.5) * (picture.t1 - picture.t0) / picture.width
    _click(qtbot, window, t, row)
    details = window.details
    assert details is not None and details.kind == "instruction"
    loaded = window.session.profiles[0]
    expected_id = int(window.timeline.frame.spans[row].id[k])
    assert details.id == expected_id
    con = duckdb.connect()
    opcode, engine, start, end, hlo, layer, wait = con.execute(
        f"SELECT opcode, engine, start_ts, end_ts, hlo_name, layer, evt_wait_time_ns "
        f"FROM {_sql(loaded.profile, 'Instruction')} WHERE id = {expected_id}"
    ).fetchone()
    assert engine == "Vector"
    assert start - loaded.origin <= t + (picture.t1 - picture.t0) / picture.width * 2
    assert end - loaded.origin >= t - (picture.t1 - picture.t0) / picture.width * 2
    panel = window.details_panel
    assert panel.field("opcode") == opcode
    assert panel.field("HLO op") == hlo and panel.field("layer") == layer
    assert panel.field("duration").replace(" ", "").startswith(str(end - start)) or end - start >= 1000
    assert panel.field("source line") not in (None, "–")
    assert (panel.field("semaphore wait") == "–") == (wait is None)
    assert window.timeline.selection.isVisible()


def test_dependencies_jump_to_the_dma_and_back(window_factory: Any) -> None:
    window = window_factory(BERT)
    loaded = window.session.profiles[0]
    con = duckdb.connect()
    instr_id, start, end, out_id = con.execute(
        f"SELECT i.id, i.start_ts, i.end_ts, f.out_id FROM {_sql(loaded.profile, 'Instruction')} i "
        f"JOIN {_sql(loaded.profile, 'Flow')} f ON f.in_id = i.id AND f.in_table = 'instruction' "
        f"ORDER BY i.start_ts LIMIT 1"
    ).fetchone()
    window.reveal_instruction(0, instr_id, start, end)
    assert window.details.id == instr_id
    successors = [d for d in window.details.dependencies if d.direction == "successor"]
    assert [d.id for d in successors] == [out_id] and successors[0].table == "dma_block"
    window.details_panel.deps.setCurrentCell(0, 0)
    window.details_panel._activate(0)
    assert window.details.kind == "dma" and window.details.id == out_id
    t0, t1 = window.timeline.time_range()
    assert t0 <= successors[0].start_ts - loaded.origin <= t1
    back = [d for d in window.details.dependencies if d.direction == "predecessor"]
    assert back and back[0].id == instr_id
    window.jump_to_dependency(back[0])
    assert window.details.id == instr_id


def _union(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s >= reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def test_box_select_summary_matches_duckdb(window_factory: Any) -> None:
    window = window_factory(BERT)
    loaded = window.session.profiles[0]
    timeline = window.timeline
    span = timeline.span
    t0 = int(span[0] + (span[1] - span[0]) * 0.2)
    t1 = int(span[0] + (span[1] - span[0]) * 0.6)
    rows = [_row_index(window, "TensorMatrix"), _row_index(window, "Vector"), _row_index(window, "Scalar")]
    timeline.view.boxed.emit(float(t0), float(t1), float(min(rows)), float(max(rows)) + 0.5)
    summary = window.region_panel.summary
    assert summary is not None
    chosen = [window.rows[i] for i in range(min(rows), max(rows) + 1) if window.rows[i].kind == "instruction"]
    a, b = t0 + loaded.origin, t1 + loaded.origin
    con = duckdb.connect()
    instr = _sql(loaded.profile, "Instruction")
    tracks = ", ".join(f"'{r.label}'" for r in chosen)
    expected = con.execute(f"""
        SELECT opcode, count(*), sum(least(end_ts, {b}) - greatest(start_ts, {a})) FROM {instr}
        WHERE coalesce(timeline_track, engine) IN ({tracks}) AND start_ts < {b} AND end_ts > {a}
        GROUP BY opcode""").fetchall()
    assert {(o.opcode, o.count, o.time_ns) for o in summary.opcodes} == {
        (o, n, int(t)) for o, n, t in expected
    }
    for busy, row in zip(summary.busy, chosen):
        spans = con.execute(f"""SELECT greatest(start_ts, {a}), least(end_ts, {b}) FROM {instr}
                                WHERE coalesce(timeline_track, engine) = '{row.label}'
                                  AND start_ts < {b} AND end_ts > {a}""").fetchall()
        assert busy.name == row.shown and busy.busy_ns == _union(spans)
        assert busy.fraction == pytest.approx(_union(spans) / (b - a))
    # a Tensor row is boxed: the engine's union across both of its rows is listed too
    union = summary.busy[-1]
    spans = con.execute(f"""SELECT greatest(start_ts, {a}), least(end_ts, {b}) FROM {instr}
                            WHERE engine = 'Tensor' AND start_ts < {b} AND end_ts > {a}""").fetchall()
    assert union.name.startswith("Tensor engine") and union.busy_ns == _union(spans)
    # the device's figures over the window are formats.figures' (one definition for every view)
    from formats.figures import Window, figures

    device = figures(loaded.profile, Window.span(a, b))
    assert summary.device == device
    packets, nbytes, read = con.execute(
        f"SELECT count(*), sum(transfer_bytes), sum(hbm_read_bytes) FROM {_sql(loaded.profile, 'DmaPacket')} "
        f"WHERE start_ts >= {a} AND start_ts < {b}"
    ).fetchone()
    assert (summary.dma_packets, summary.dma_bytes) == (packets, nbytes)
    assert device.hbm.read == read and read > 0  # not the instructions' 0 B
    (flops,) = con.execute(f"""
        SELECT sum(raw_flops) FROM {instr}
        WHERE engine = 'Tensor' AND raw_hlo_id IS NOT NULL AND start_ts >= {a} AND start_ts < {b}"""
    ).fetchone()
    assert summary.model_flops == flops
    meta = loaded.metadata
    peak = (
        2
        * meta["tensor_engine_num_rows"]
        * meta["tensor_engine_num_cols"]
        * meta["tensor_engine_clock_freq"]
        * 1e9
    )
    assert summary.mfu == pytest.approx(flops / (peak * (b - a) * 1e-9))
    assert window.timeline.region.isVisible()
    table = window.region_panel.lines
    lines = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    from formats.units import fmt_bytes, fmt_gbps, fmt_pct

    assert lines["HBM read"] == fmt_bytes(read)
    assert lines["DMA throughput"] == fmt_gbps(nbytes / ((b - a) * 1e-9))
    assert lines["MFU"] == fmt_pct(summary.mfu)


def test_colour_modes_change_the_picture(window_factory: Any) -> None:
    window = window_factory(BERT)
    row = _row_index(window, "Vector")
    slot = window.timeline.picture.rows.index(row)
    band = slice(slot * 20 + 5, slot * 20 + 10)

    def colours() -> set[tuple[int, ...]]:
        pixels = window.timeline.picture.image[band].reshape(-1, 4)
        return {tuple(p) for p in pixels.tolist()}

    engine = colours()
    for mode in ("opcode", "layer", "hlo"):
        window.set_mode(mode)
        assert window.mode_box.currentData() == mode
        assert colours() != engine
    window.set_mode("engine")
    assert colours() == engine


def test_hierarchy_click_highlights_and_zooms(window_factory: Any) -> None:
    window = window_factory(BERT)
    tree = window.hierarchy
    node = next(n for n in tree.nodes if n.kind == "hlo" and n.instructions and n.instructions > 3)
    window.flame.node_clicked.emit(node)
    loaded = window.session.profiles[0]
    t0, t1 = window.timeline.time_range()
    assert t0 <= node.start - loaded.origin and node.end - loaded.origin <= t1
    assert (t1 - t0) < (window.timeline.span[1] - window.timeline.span[0])
    frame = window.timeline.fetch_now()
    lit = {int(i) for w in frame.highlights.values() for i in w.id}
    con = duckdb.connect()
    ids = {
        r[0]
        for r in con.execute(
            f"SELECT id FROM {_sql(loaded.profile, 'Instruction')} WHERE raw_hlo_id = {node.raw_id}"
        ).fetchall()
    }
    assert lit and lit <= ids
    window.timeline.handle_key(Qt.Key.Key_Escape)
    assert window.timeline.highlight is None


def test_source_lines_highlight_their_instructions(window_factory: Any) -> None:
    window = window_factory(BERT)
    panel = window.source_panel
    assert panel.times is not None and panel.files.count() > 0
    per_line = panel.times.lines_of(panel.path)
    line = max(per_line, key=lambda n: per_line[n].self_ns)
    panel.show_file(panel.path, line)
    assert panel.selected_lines() == [(panel.path, line)]
    highlight = window.timeline.highlight
    assert highlight is not None and "stack_frame_ids" in highlight.where
    loaded = window.session.profiles[0]
    con = duckdb.connect()
    (count, total) = con.execute(
        f"SELECT count(*), sum(duration_ns) FROM {_sql(loaded.profile, 'Instruction')} "
        f"WHERE {highlight.where}"
    ).fetchone()
    assert count == per_line[line].instructions and total > 0
    # a line's time is formats.attribution's (the union of its ops' events: the tree's), not Σ durations
    from formats.attribution import attribute

    assert per_line[line].inclusive_ns == attribute(loaded.profile).lines[(panel.path, line)].inclusive_ns
    frame = window.timeline.fetch_now()
    assert sum(len(w) for w in frame.highlights.values()) > 0


def test_search_lists_and_highlights(window_factory: Any) -> None:
    window = window_factory(BERT)
    panel = window.search_panel
    panel.field.setCurrentIndex(panel.field.findData("opcode"))
    panel.text.setText("matmul")
    panel.submit()
    loaded = window.session.profiles[0]
    con = duckdb.connect()
    (count,) = con.execute(
        f"SELECT count(*) FROM {_sql(loaded.profile, 'Instruction')} WHERE opcode ILIKE '%matmul%'"
    ).fetchone()
    assert panel.result.total == count > 0
    assert panel.results.rowCount() == min(count, 500)
    assert window.timeline.highlight is not None
    first = panel.result.rows[0]
    panel._activate(0)
    assert window.details.id == first["id"]
    panel.regex.setChecked(True)
    panel.text.setText("[unclosed")
    panel.submit()
    assert "regular expression" in panel.status.text()
    panel.clear()
    assert window.timeline.highlight is None


def test_async_window_draws_without_blocking(qt_app: Any, qtbot: Any) -> None:
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.session import open_session

    window = MainWindow(open_session([str(LLAMA_TP2)]))
    qtbot.addWidget(window)
    window.resize(1200, 800)
    window.show()
    try:
        qtbot.waitUntil(
            lambda: (
                window.timeline.frame is not None
                and not window.timeline.frame.pending
                and len(window.fetcher.lods_ready) >= 4
            ),
            timeout=20_000,
        )
        qtbot.waitUntil(lambda: window.hierarchy is not None, timeout=10_000)
        before = window.timeline.frame
        window.timeline.zoom(0.5)
        qtbot.waitUntil(lambda: window.timeline.frame is not before, timeout=10_000)
        assert window.timeline.latencies_ms
    finally:
        window.release()


def test_critical_path_is_highlighted(window_factory: Any) -> None:
    """Analyze > Highlight critical path lights exactly the path's instructions."""
    from formats.read_api import analyze

    window = window_factory(BERT)
    loaded = window.session.profiles[0]
    window.highlight_critical_path()
    highlight = window.timeline.highlight
    assert highlight is not None and highlight.description.startswith("critical path:")
    path = analyze(loaded.profile).critical_path
    assert path is not None
    expected = {int(i) for i, k in zip(path.event_ids, path.event_kinds) if k == 0}
    frame = window.timeline.fetch_now()
    lit = {int(i) for w in frame.highlights.values() for i in w.id}
    assert lit and lit <= expected
