"""``neuron-top``: the live terminal view of NeuronCores (issue 7).

Layers, each its own module, nvitop-style (data API apart from the screen):

    snapshots      immutable snapshots: Frame, ProcessSnapshot, CoreUse, ...   (the typed data API)
    report         a neuron-monitor report -> snapshots
    live_source    our live state -> frames;  monitor_source: a neuron-monitor stream -> frames
    host           host vCPU / memory for the live source;  history: sparkline buffers
    aggregate      tabs and the "all" rules;  memtree: the memory tree and its keys
    fmt, render    number formats and every panel as Rich Text (screen and --once alike)
    collector      the collection thread;  widgets, screens, top_app: Textual;  text_frame: --once
    cli            ``neuron-top`` itself
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point (imports the CLI on call, keeping ``import explorer.top`` cheap)."""
    from explorer.top.cli import main as cli_main

    return cli_main(argv)


__all__ = ["main"]
