"""The interactive profile viewer behind ``neuron-profile view DIR`` (Textual).

    from explorer.viewer import ViewerApp, ProfileData
    ViewerApp(entries, source_root=Path("src")).run()

``data`` answers queries as immutable snapshots (``view_model``) in worker threads; ``viewer_app`` draws them.
The pieces: ``hierarchy`` (layer -> op tree from the hierarchy tables and the Instruction scan),
``code_links`` (stack frames -> lines, --source-root lookup), ``problems`` (rule-based findings),
``engine_strip`` (engine occupancy strip, exact: ``busy_rows``), ``summary_figures``/``text`` (formatting),
``treetable``/``panes`` (widgets), ``view_command`` (the ``view`` subcommand).

Nothing is imported here eagerly: ``neuron-profile`` imports ``explorer.viewer.view_command`` for every
subcommand, and only ``view`` without ``--output-format`` should pay for loading Textual.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProfileData", "ViewerApp"]


def __getattr__(name: str) -> Any:
    if name == "ViewerApp":
        from explorer.viewer.viewer_app import ViewerApp

        return ViewerApp
    if name == "ProfileData":
        from explorer.viewer.data import ProfileData

        return ProfileData
    raise AttributeError(f"module 'explorer.viewer' has no attribute {name!r}")
