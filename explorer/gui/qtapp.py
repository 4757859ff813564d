"""The one QApplication, configured for drawing without a GPU.

pyqtgraph is told not to use OpenGL and to draw antialiased-free raster images (its defaults, set
explicitly so nothing in the environment switches them), and images are shown as they are
(``imageAxisOrder='row-major'``, matching the NumPy rasters).
"""

from __future__ import annotations

from PySide6.QtWidgets import QApplication


def application() -> QApplication:
    """The running QApplication, created on first use."""
    import pyqtgraph as pg

    pg.setConfigOptions(
        useOpenGL=False, antialias=False, imageAxisOrder="row-major", background="w", foreground="k"
    )
    app = QApplication.instance()
    if app is None:
        app = QApplication(["neuron-explorer"])
        app.setApplicationName("neuron-explorer")
    assert isinstance(app, QApplication)
    return app
