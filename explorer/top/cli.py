"""``neuron-top``: command line, source selection, and the choice between the screen and ``--once``.

    neuron-top                               live state of the processes on this host
    neuron-top --from-monitor report.jsonl   a neuron-monitor stream in a file (followed as it grows)
    neuron-monitor | neuron-top --from-monitor -
    ssh host neuron-monitor | neuron-top --from-monitor -      a real host's stream
    neuron-top --once                        one frame as plain text, then exit
    neuron-top --interval 0.5 --instance trn2.48xlarge

Usage mistakes are one line on stderr and exit 2 (the real tool exits on unknown arguments too).
With ``--from-monitor -`` the stream arrives on stdin, so the keyboard is read from the terminal
instead: stdin is moved to another descriptor and ``/dev/tty`` takes its place, as the old Python
neuron-top did. Textual is imported only for the screen; ``--once`` stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from collectors import livedemand, livepaths
from collectors.inventory import InventoryError, discover
from explorer.top import render
from explorer.top.text_frame import frame_text
from neuronscope.cli_kit import OneLineParser

if TYPE_CHECKING:
    from explorer.top.live_source import LiveSource
    from explorer.top.monitor_source import MonitorSource
    from explorer.top.snapshots import Frame

MIN_INTERVAL_S = 0.05


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="neuron-top",
        description="Live view of NeuronCores, device memory and the processes using them.")
    parser.add_argument("--from-monitor", metavar="FILE|-",
                        help="read a neuron-monitor stream (ours or a real host's) from FILE or stdin")
    parser.add_argument("--once", action="store_true", help="print one frame as plain text and exit")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="refresh interval in seconds (default 1)")
    parser.add_argument("--instance",
                        help="simulated instance type to show (live state; default: configured)")
    parser.add_argument("--width", type=int, default=None, metavar="N",
                        help="--once: line width (default: terminal width, else 120)")
    parser.add_argument("--version", action="version", version=f"neuron-top {render.tool_version()}")
    return parser


def _fail(message: str) -> int:
    print(f"neuron-top: {message}", file=sys.stderr)
    return 2


def _monitor_source(path: str, stream: TextIO | None) -> MonitorSource:
    from explorer.top.monitor_source import MonitorSource

    return MonitorSource(path, stream)


def _keyboard_from_tty() -> TextIO:
    """Move the piped stream off fd 0 and put the terminal there (Textual reads keys from fd 0)."""
    stream_fd = os.dup(0)
    tty = os.open("/dev/tty", os.O_RDONLY)
    os.dup2(tty, 0)
    os.close(tty)
    return os.fdopen(stream_fd, "r", encoding="utf-8", errors="replace")


def _once_monitor(source: MonitorSource, interval: float) -> Frame | int:
    """The frame to print: a file's last report, or a pipe's first (waiting for it); a status if none."""
    frame = source.poll()
    while source.reports == 0 and not source.ended and source.is_pipe:
        time.sleep(min(interval, 0.05))
        frame = source.poll() or frame
    if source.reports == 0:
        return _fail(f"no neuron-monitor report in {source.name}")
    assert frame is not None  # a source's first poll always makes a frame
    return frame


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.interval >= MIN_INTERVAL_S:
        return _fail(f"--interval must be at least {MIN_INTERVAL_S} s, not {args.interval}")
    if args.width is not None and args.width < 40:
        return _fail(f"--width must be at least 40, not {args.width}")
    if args.from_monitor is not None and args.instance:
        return _fail("--instance applies to live state; a neuron-monitor stream says what hardware it is")
    tty_problem = (None if args.once or sys.stdout.isatty()
                   else "stdout is not a terminal; use --once for plain text")
    width = args.width or (os.get_terminal_size().columns if sys.stdout.isatty() else 120)
    source: MonitorSource | LiveSource
    try:
        if args.from_monitor is not None:
            if args.from_monitor == "-":
                if sys.stdin.isatty():
                    return _fail("--from-monitor -: stdin is a terminal; pipe a neuron-monitor stream in")
                if tty_problem:
                    return _fail(tty_problem)
                stream = sys.stdin if args.once else _keyboard_from_tty()
                source = _monitor_source("-", stream)
            else:
                path = Path(args.from_monitor)
                if not path.is_file():
                    return _fail(f"--from-monitor: {path}: no such file")
                source = _monitor_source(str(path), None)
        else:
            from explorer.top.live_source import LiveSource

            livepaths.check_live_dir()  # someone else's or an open directory: one line, exit 2
            source = LiveSource(discover(args.instance), follow_publishers=args.instance is None)
            # asking is watching: model-running processes publish while a watch file is present
            # (collectors.livedemand); removed at exit
            livedemand.Watch(source.live_dir).start()
    except (InventoryError, ValueError, livepaths.LiveDirError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{args.from_monitor}: {exc.strerror or exc}")
    if tty_problem:
        source.close()
        return _fail(tty_problem)

    if args.once:
        if source.kind == "monitor":
            once = _once_monitor(source, args.interval)
            if isinstance(once, int):
                return 1
            frame = once
        else:
            source.poll()  # baseline: rates are over the interval that follows
            time.sleep(args.interval)
            frame = source.poll()
        source.close()
        sys.stdout.write(frame_text(frame, width=width))
        return 0

    from explorer.top.top_app import NeuronTopApp

    NeuronTopApp(source, interval=args.interval).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
