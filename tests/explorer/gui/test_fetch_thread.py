"""The timeline's thread rules, exercised: the fetch thread renders from the rows its request carries
(an immutable ``RowSet``), never from the widget, while the UI thread keeps changing the rows; frames
of an old row set are dropped; pixel owners decode through one typed function; the status line is
data (``FrameStatus``), not text taken apart."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import LLAMA_TP2

require_gui()


def test_rows_change_while_the_fetch_thread_renders(qt_app: Any, qtbot: Any) -> None:
    from explorer.gui import colors
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.rows import HEADER
    from explorer.gui.session import open_session
    from explorer.gui.timeline import ROW_PX

    window = MainWindow(open_session([str(LLAMA_TP2)]))  # asynchronous: the real fetch thread
    qtbot.addWidget(window)
    window.resize(1200, 800)
    window.show()
    timeline = window.timeline
    shown: list[tuple[Any, Any]] = []
    painted_on: set[str] = set()
    render = window.fetcher.renderer
    assert render is not None

    def spy(frame: Any) -> Any:  # the renderer, as the fetch thread calls it
        painted_on.add(threading.current_thread().name)
        return render(frame)

    window.fetcher.renderer = spy
    timeline.frame_shown.connect(lambda frame: shown.append((frame, timeline.row_set)))
    try:
        qtbot.waitUntil(lambda: timeline.frame is not None, timeout=60_000)
        full = timeline.rows
        variants = [full[::-1], full[1::2], tuple(r for r in full if r.kind != HEADER), full]
        for step in range(24):  # the UI changes rows and zooms while frames are fetched and painted
            timeline.set_rows(variants[step % len(variants)])
            timeline.zoom(0.8 if step % 2 else 1.25)
            qtbot.wait(15)
        qtbot.waitUntil(
            lambda: window.fetcher.idle
            and timeline.frame is not None
            and timeline.frame.request.row_set is timeline.row_set,
            timeout=60_000,
        )
    finally:
        window.release()
    assert painted_on == {"frame-fetch"}
    assert timeline.row_set.rows == full and window.rows == full
    assert shown
    for frame, current in shown:
        assert frame.request.row_set is current  # never a frame of rows no longer shown
        picture = frame.picture
        assert picture is not None and picture.rows == frame.request.rows
        assert picture.image.shape[0] == len(frame.request.rows) * ROW_PX
        for slot, index in enumerate(frame.request.rows):  # bands drawn for the request's own rows
            band = picture.image[slot * ROW_PX : (slot + 1) * ROW_PX]
            is_header = bool(np.all(band == np.array(colors.HEADER_FILL, np.uint8)))
            assert is_header == (frame.request.row_set[index].kind == HEADER), (slot, index)


def test_pixel_owners_decode_in_one_place() -> None:
    from explorer.gui.raster import OwnerLayer, PixelOwner, PixelOwners, owners_of

    base = owners_of(np.array([0, 4]), np.array([2, 6]), 8)  # events 0 and 1 over columns 0-1, 4-5
    owners = PixelOwners.of(base)
    assert owners.at(0) == PixelOwner(OwnerLayer.BASE, 0)
    assert owners.at(3) == PixelOwner(OwnerLayer.BASE, 1)  # one column off: the slack finds event 1
    assert owners.at(7) == PixelOwner(OwnerLayer.BASE, 1)
    assert owners.at(3, nearest=(0,)) is None
    lit = owners_of(np.array([5]), np.array([6]), 8)  # highlight event 0 over column 5
    both = owners.with_highlight(lit)
    assert both.at(5) == PixelOwner(OwnerLayer.HIGHLIGHT, 0)
    assert both.at(4) == PixelOwner(OwnerLayer.BASE, 1)
    assert owners.at(5) == PixelOwner(OwnerLayer.BASE, 1)  # the base owners are not changed
    assert PixelOwners.of(np.full(4, -1)).at(1) is None


def test_frame_status_is_data() -> None:
    from explorer.gui.frames import FrameData, FrameRequest, FrameStatus, RowSource

    frame = FrameData(FrameRequest(1, 0, 10, 16, (0, 1, 2, 3)), fetch_ms=12.4)
    frame.sources = {0: RowSource.LOD, 1: RowSource.EVENTS, 2: RowSource.LOD, 3: RowSource.STORED_LOD}
    frame.pending = {3}
    assert frame.status == FrameStatus(12.4, (RowSource.STORED_LOD, RowSource.EVENTS, RowSource.LOD), 1)
    assert frame.status.text() == "window fetched in 12 ms (InstructionLod lod, events, lod), 1 rows loading"
    assert FrameData(FrameRequest(1, 0, 10, 16, ())).status.text() == "window fetched in 0 ms (nothing)"


def test_a_late_signal_after_release_asks_for_nothing(qt_app: Any, qtbot: Any) -> None:
    """``lods_done`` (queued from the level-of-detail thread) can arrive after the window was released;
    the focus reload it starts must not submit to the shut-down pool (it raised RuntimeError)."""
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.session import open_session

    window = MainWindow(open_session([str(LLAMA_TP2)]))
    qtbot.addWidget(window)
    window.release()
    window.load_focus()  # what a late lods_done does
    assert window.runner.submit(print, "never") is None
