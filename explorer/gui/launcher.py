"""``neuron-explorer``: open profiles in the GUI, or render one to a PNG without a display.

    neuron-explorer out/bert                          # a profile directory
    neuron-explorer out/llama/device                  # a capture's device/ folder: grouped per core
    neuron-explorer A B --compare                     # two profiles stacked, summary deltas
    neuron-explorer out/bert --screenshot bert.png --range 10us:40us --color-by opcode

Usage mistakes and unreadable input are one line on stderr and exit 2, never a traceback. Without a
display (no ``$DISPLAY`` / ``$WAYLAND_DISPLAY``) only ``--screenshot`` works; it renders on Qt's
offscreen platform with the raster paint engine (no GPU, no OpenGL).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from neuronscope.cli_kit import OneLineParser

if TYPE_CHECKING:  # Qt is imported only once the command line has been checked (the gui extra may be absent)
    from PySide6.QtWidgets import QMainWindow, QStatusBar

    from explorer.gui.timeline import TimelineWidget

PROG = "neuron-explorer"
EXIT_BAD_INPUT = 2


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog=PROG, description="Browse Neuron profiles: timeline, hierarchy, source, search, compare."
    )
    parser.add_argument(
        "dirs",
        nargs="*",
        metavar="DIR",
        help="profile directories, or folders of them (a capture's device/ folder)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="compare two profiles (exactly two DIRs): stacked timelines, summary deltas",
    )
    parser.add_argument("--screenshot", metavar="PNG", help="render offscreen to this PNG and exit")
    parser.add_argument(
        "--range",
        metavar="T0:T1",
        dest="time_range",
        help="time range to show, relative to the profile start (e.g. 10us:40us; ns by default)",
    )
    parser.add_argument(
        "--color-by",
        "--colour-by",
        dest="color_by",
        default="engine",
        choices=("engine", "opcode", "layer", "hlo"),
        help="event colours (default: engine)",
    )
    parser.add_argument("--size", default="1600x900", metavar="WxH", help="window size for --screenshot")
    return parser


def parse_range(text: str) -> tuple[int, int]:
    """``T0:T1`` with units -> (t0, t1) ns; ValueError (one line) if malformed or empty."""
    from explorer.gui.timeaxis import parse_time

    if ":" not in text:
        raise ValueError(f"--range {text!r}: expected T0:T1, e.g. 10us:40us")
    left, right = text.split(":", 1)
    t0, t1 = parse_time(left), parse_time(right)
    if t1 <= t0:
        raise ValueError(f"--range {text!r}: the end must be after the start")
    return t0, t1


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size {text!r}: expected WIDTHxHEIGHT, e.g. 1600x900") from None
    if not (200 <= w <= 10000 and 200 <= h <= 10000):
        raise ValueError(f"--size {text!r}: width and height must be 200..10000 pixels")
    return w, h


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        time_range = parse_range(args.time_range) if args.time_range else None
        size = parse_size(args.size)
    except ValueError as exc:
        return _error(str(exc))
    if not args.dirs:
        return _error(
            "no profile given: neuron-explorer DIR [DIR ...] (a profile directory or a capture's "
            "device/ folder)"
        )
    if args.compare and len(args.dirs) != 2:
        return _error(f"--compare needs exactly two profiles, got {len(args.dirs)}")
    missing = [d for d in args.dirs if not os.path.exists(d)]
    if len(missing) == len(args.dirs):  # nothing to open: say so before asking for a display
        return _error(f"{missing[0]}: no such profile directory")
    headless = args.screenshot is not None
    if headless:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    elif not (
        os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")
        or os.environ.get("QT_QPA_PLATFORM")
        or sys.platform in ("darwin", "win32")
    ):
        return _error("no display to open a window on; use --screenshot PNG to render offscreen")
    try:
        from explorer.gui.qtapp import BindingError, application
    except ImportError as exc:
        return _error(
            f"the GUI needs the gui extra (PySide6, pyqtgraph): pip install 'neuronscope[gui]' ({exc})"
        )
    if not headless:
        from explorer.gui import platformcheck

        absent = platformcheck.missing_xcb_libraries()
        if absent:  # Qt would print a paragraph and abort the process: one line and exit 2 instead
            return _error(platformcheck.xcb_error(absent))
    from explorer.gui.session import SessionError
    from formats.read_api import ProfileError

    try:
        app = application()
        if headless:
            from explorer.gui.screenshot import render_screenshot

            layout = render_screenshot(
                args.dirs,
                args.screenshot,
                time_range=time_range,
                size=size,
                mode=args.color_by,
                compare=args.compare,
            )
            for warning in layout.warnings:
                print(f"{PROG}: warning: {warning}", file=sys.stderr)
            return 0
        window = _open_window(args.dirs, args.compare, time_range, args.color_by)
        window.resize(*size)
        window.show()
        return int(app.exec())
    except (SessionError, ProfileError, BindingError) as exc:
        return _error(str(exc))
    except OSError as exc:
        return _error(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    except KeyboardInterrupt:
        return 130


def _open_window(dirs: Sequence[str], compare: bool, time_range: tuple[int, int] | None,
                 mode: str) -> QMainWindow:
    from explorer.gui.compare_window import open_compare
    from explorer.gui.mainwindow import MainWindow
    from explorer.gui.session import open_session

    if compare:
        pair = open_compare(dirs[0], dirs[1])
        if time_range:
            _show_range(pair.timelines[0], time_range, pair.statusBar())
        for timeline in pair.timelines:
            timeline.set_mode(mode)
        return pair
    window = MainWindow(open_session(dirs))
    window.set_mode(mode)
    if time_range:
        _show_range(window.timeline, time_range, window.statusBar())
    return window


def _show_range(timeline: TimelineWidget, time_range: tuple[int, int], status: QStatusBar) -> None:
    """Show ``--range``, cut to the profile; a range past its end is clamped with a warning."""
    t0, t1, warning = timeline.clamp_to_span(*time_range)
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
        status.showMessage(f"--range: {warning}", 20000)
    timeline.set_range(t0, t1)


if __name__ == "__main__":
    sys.exit(main())
