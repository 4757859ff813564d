"""The interactive profile viewer behind ``neuron-profile view DIR`` (Textual).

    from explorer.viewer import ViewerApp, ProfileData
    ViewerApp(entries, source_root=Path("src")).run()

``data`` answers queries as immutable snapshots (``model``) in worker threads; ``app`` draws them.
The pieces: ``hierarchy`` (layer -> op tree from the hierarchy tables and the Instruction scan),
``source`` (stack frames -> lines, --source-root lookup), ``problems`` (rule-based findings),
``timeline`` (engine occupancy strip on formats.viewport), ``figures``/``text`` (formatting),
``treetable``/``panes`` (widgets), ``cli`` (the ``view`` subcommand).
"""

from explorer.viewer.app import ViewerApp
from explorer.viewer.data import ProfileData

__all__ = ["ProfileData", "ViewerApp"]
