"""The one QApplication, configured for drawing without a GPU, after checking the Qt binding is sound.

pyqtgraph is told not to use OpenGL and not to antialias (its defaults, set explicitly so nothing
in the environment switches them), and images are row-major, matching the NumPy rasters.

The binding check: PySide6 6.12.0's abi3 wheels assume Python >= 3.12's immortal ``None``; on 3.11
each Qt call that returns ``None`` takes a reference away from ``None`` and the interpreter aborts
("none_dealloc") after a few thousand calls -- a GUI makes that many in seconds. ``pyproject`` keeps
that version off 3.11; ``check_binding`` turns any such build into a one-line error up front instead
of a crash in the middle of a session.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QApplication


class BindingError(RuntimeError):
    """The installed Qt binding would crash this interpreter; ``str()`` is one line."""


def check_binding() -> None:
    """Raise ``BindingError`` if Qt calls returning None leak references away from None."""
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(64):
        probe.setObjectName("probe")
    if sys.getrefcount(None) < before - 32:
        import PySide6

        raise BindingError(
            f"PySide6 {PySide6.__version__} is broken on Python {sys.version.split()[0]} (Qt calls "
            f"drop references to None and the process would abort): install "
            f"'PySide6-Essentials<6.12' or use Python >= 3.12"
        )


def application() -> QApplication:
    """The running QApplication, created on first use."""
    import pyqtgraph as pg

    check_binding()
    pg.setConfigOptions(
        useOpenGL=False, antialias=False, imageAxisOrder="row-major", background="w", foreground="k"
    )
    app = QApplication.instance()
    if app is None:
        app = QApplication(["neuron-explorer"])
        app.setApplicationName("neuron-explorer")
    assert isinstance(app, QApplication)
    return app
