"""GUI tests run offscreen (Qt's offscreen platform, raster paint engine) and skip without the gui extra.

``QT_QPA_PLATFORM`` must be set before Qt is imported, hence at the top of this conftest. Each test
module starts with ``tests.fixtures.gui.require_gui()`` (a module-level skip when PySide6, pyqtgraph or
pytest-qt is missing); this conftest imports no Qt itself. Profiles come from ``sample_profiles/``
(read only, ``tests.fixtures.samples``) or are written into ``tmp_path`` by the tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def qt_app() -> object:
    """The QApplication, configured as neuron-explorer configures it (no OpenGL, row-major images)."""
    from explorer.gui.qtapp import application

    return application()


@pytest.fixture
def window_factory(qt_app: object, qtbot: object) -> Iterator[object]:
    """Builds synchronous MainWindows on given paths and releases them after the test."""
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.session import open_session

    made = []

    def make(*paths: Path, size: tuple[int, int] = (1500, 900)) -> MainWindow:
        window = MainWindow(open_session([str(p) for p in paths]), synchronous=True)
        qtbot.addWidget(window)  # type: ignore[attr-defined]
        window.resize(*size)
        window.show()
        qt_app.processEvents()  # type: ignore[attr-defined]
        window.timeline.fetch_now()
        made.append(window)
        return window

    yield make
    for window in made:
        window.release()
