"""Compare: two profiles stacked with one time axis, summary deltas, different instances labelled."""

from __future__ import annotations

from typing import Any

import pytest

from tests.explorer.gui.conftest import BERT, MATMUL, require_gui

require_gui()


@pytest.fixture
def compare(qt_app: Any, qtbot: Any) -> Any:
    from explorer.gui.compare_window import open_compare

    window = open_compare(str(BERT), str(MATMUL), synchronous=True)
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    qt_app.processEvents()
    window.fetch_now()
    yield window
    window.release()


def test_zoom_is_synchronised(compare: Any) -> None:
    a, b = compare.timelines
    assert a.time_range() == pytest.approx(b.time_range())
    a.zoom(0.25)
    assert b.time_range() == pytest.approx(a.time_range())
    b.pan(0.3)
    assert a.time_range() == pytest.approx(b.time_range())
    for timeline in compare.timelines:
        frame = timeline.fetch_now()
        assert frame.spans and not frame.pending


def test_summary_deltas_and_instance_labels(compare: Any) -> None:
    from formats.summary import summary_row

    a, b = (s.profiles[0] for s in compare.sessions)
    assert "trn1" in compare.labels[0].text() and "trn2" in compare.labels[1].text()
    assert compare.note.isVisible() and "different instances" in compare.note.text()
    rows = {r.metric: r for r in compare.rows_shown}
    sa, sb = summary_row(a.profile), summary_row(b.profile)
    total = rows["total time"]
    assert total.a == pytest.approx(sa["total_time"]) and total.b == pytest.approx(sb["total_time"])
    assert total.delta == pytest.approx(sb["total_time"] - sa["total_time"])
    mfu = rows["MFU"]
    assert mfu.delta == pytest.approx((sb["mfu_estimated_percent"] - sa["mfu_estimated_percent"]) * 100)
    assert compare.table.rowCount() == len(compare.rows_shown)
    assert compare.table.item(0, 0).text() == "total time"
