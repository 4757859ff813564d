"""The interactive profile viewer behind ``neuron-profile view DIR`` (Textual).

    from explorer.viewer import ViewerApp, ProfileData
    ViewerApp(entries, source_root=Path("src")).run()

``data`` answers queries as immutable snapshots (``model``) in worker threads; ``app`` draws them.
The pieces: ``hierarchy`` (layer -> op tree from the hierarchy tables and the Instruction scan),
``source`` (stack frames -> lines, --source-root lookup), ``problems`` (rule-based findings),
``timeline`` (engine occupancy strip on formats.viewport), ``figures``/``text`` (formatting),
``treetable``/``panes`` (widgets), ``cli`` (the ``view`` subcommand).

Nothing is imported here eagerly: ``neuron-profile`` imports ``explorer.viewer.cli`` for every
subcommand, and only ``view`` without ``--output-format`` should pay for loading Textual.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProfileData", "ViewerApp"]


def __getattr__(name: str) -> Any:
    if name == "ViewerApp":
        from explorer.viewer.app import ViewerApp

        return ViewerApp
    if name == "ProfileData":
        from explorer.viewer.data import ProfileData

        return ProfileData
    raise AttributeError(f"module 'explorer.viewer' has no attribute {name!r}")
