"""neuron-explorer: the offline profile browsing GUI (PySide6 + pyqtgraph, the ``gui`` extra).

The package splits along one line: modules without Qt (``session``, ``rows``, ``frames``,
``raster``, ``details``, ``region``, ``hierarchy``, ``source_times``, ``search``, ``compare``) turn
profiles into plain data with DuckDB and NumPy, and are tested without a display; the Qt modules
(``timeline``, ``flame``, the panels, ``qt_tables``, ``mainwindow``, ``launcher``) only draw that
data and route clicks back. Nothing here imports Qt at package import time, so
``import explorer.gui`` works without the extra installed.

Entry point: ``neuron-explorer`` (``explorer.gui.launcher:main``); docs/neuron-explorer.md.
"""
