"""Render the explorer offscreen to a PNG: ``neuron-explorer DIR --screenshot out.png``.

The window is built as on screen, but every query runs synchronously (levels of detail, the frame,
the hierarchy, the summary) so the picture is complete when it is grabbed. Returns where each
timeline row landed in the image, so tests (and anyone annotating the picture) can find the rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.gui.qtapp import application

if TYPE_CHECKING:
    from explorer.gui.compare_window import CompareWindow
    from explorer.gui.mainwindow import MainWindow


@dataclass
class Layout:
    """Where things are in the saved image: per row label, its pixel band; the data columns."""

    path: Path
    width: int
    height: int
    bands: dict[str, tuple[int, int]] = field(default_factory=dict)  # "group/label" -> (top, bottom)
    columns: tuple[int, int] = (0, 0)
    warnings: list[str] = field(default_factory=list)  # e.g. a range clamped to the profile


def render_screenshot(
    dirs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    time_range: tuple[int, int] | None = None,
    size: tuple[int, int] = (1600, 900),
    mode: str = "engine",
    compare: bool = False,
) -> Layout:
    """Open ``dirs`` (two of them with ``compare``), show ``time_range`` (relative ns; the whole
    profile by default) coloured by ``mode``, and save the window to ``out`` (PNG)."""
    app = application()
    from explorer.gui.compare_window import open_compare
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.session import open_session

    target = Path(out)
    if target.parent and not target.parent.exists():
        raise OSError(2, "no such directory", str(target.parent))
    window: CompareWindow | MainWindow
    if compare:
        pair = open_compare(str(dirs[0]), str(dirs[1]), synchronous=True)
        window, timelines = pair, pair.timelines
    else:
        single = MainWindow(open_session(list(dirs)), synchronous=True)
        single.set_mode(mode)
        single.tabs.setCurrentWidget(single.summary_table)  # nothing is selected: show the profile's figures
        window, timelines = single, [single.timeline]
    window.resize(*size)
    window.show()
    app.processEvents()
    warnings: list[str] = []
    for timeline in timelines:
        timeline.set_mode(mode)
        if time_range is not None:
            t0, t1, warning = timeline.clamp_to_span(*time_range)
            if warning and warning not in warnings:
                warnings.append(warning)
            timeline.set_range(t0, t1)
        app.processEvents()
    for timeline in timelines:
        timeline.fetch_now()
    app.processEvents()
    image = window.grab()
    if not image.save(str(target), "PNG"):
        raise OSError(5, "could not write the PNG", str(target))
    layout = Layout(target, image.width(), image.height(), warnings=warnings)
    main = timelines[0]
    left, right = main.plot_columns()
    offset = main.mapTo(window, main.rect().topLeft())
    layout.columns = (offset.x() + left, offset.x() + right)
    for index in main.visible_rows():
        band = main.row_band(index)
        if band is not None:
            row = main.rows[index]
            layout.bands[f"{row.group}/{row.label}"] = (offset.y() + band[0], offset.y() + band[1])
    window.close()
    window.release()
    return layout
