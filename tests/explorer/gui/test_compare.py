"""Compare: two profiles stacked with one time axis, summary deltas, different instances labelled."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT, MATMUL

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
    from formats.figures import from_summary
    from formats.summary import summary_row
    from formats.units import fmt_ns

    a, b = (s.profiles[0] for s in compare.sessions)
    assert "trn1" in compare.labels[0].text() and "trn2" in compare.labels[1].text()
    assert compare.note.isVisible() and "different instances" in compare.note.text()
    rows = {r.metric: r for r in compare.rows_shown}
    fa = from_summary(summary_row(a.profile), a.metadata)
    fb = from_summary(summary_row(b.profile), b.metadata)
    total = rows["total time"]
    assert total.a == pytest.approx(fa.length_ns) and total.b == pytest.approx(fb.length_ns)
    assert total.delta == pytest.approx(fb.length_ns - fa.length_ns)
    mfu = rows["MFU"]
    assert mfu.delta == pytest.approx(fb.mfu - fa.mfu)
    assert compare.table.rowCount() == len(compare.rows_shown)
    assert compare.table.item(0, 0).text() == "total time"
    assert compare.table.item(0, 1).text() == fmt_ns(fa.length_ns)
    shown = {compare.table.item(r, 0).text(): compare.table.item(r, 3).text()
             for r in range(compare.table.rowCount())}
    assert shown["MFU"].endswith(" pp")
    assert "Tensor active (both rows)" in shown
