"""``neuron-profile view``: the interactive viewer when no ``--output-format`` is given, the formats'
summary and export writers otherwise.

A subclass of ``formats.profile_commands.ViewOutputCommand`` (same arguments, plus
``--source-root``), assembled into ``neuron-profile`` by ``explorer/profile_cli.py``: formats never
import the explorer, so the explorer wraps the formats' command rather than the other way round.
Everything that can be wrong with the input is found before the terminal is taken over: a missing
directory, a folder with no profile, a profile that does not open, and a stdout that is not a
terminal are each one line on stderr and exit 2 (via ``ProfileError``, which ``neuron-profile``'s
``main`` prints).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from formats.profile_commands import EXIT_OK, ViewOutputCommand
from formats.read_api import (
    ProfileError,
    device_entries,
    find_profiles,
    open_readable,
    system_note,
    system_only,
)


class ViewCommand(ViewOutputCommand):
    """``view DIR``: the Textual viewer; ``view DIR --output-format F``: the formats' writers."""

    help = (
        "look at a profile: the interactive viewer (default), or its summary (summary-text, "
        "summary-json) or an export (json, perfetto) with --output-format"
    )

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        super().prepare_parser(parser)
        parser.add_argument(
            "--source-root",
            metavar="DIR",
            help="where the framework source files are now, if they moved since the capture "
            "(files are matched by the longest suffix of their recorded path)",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.output_format is not None:
            return super().run(args)
        return run_viewer(
            args.profile, source_root=args.source_root, include_incomplete=args.include_incomplete
        )


def run_viewer(root: str, *, source_root: str | None = None, include_incomplete: bool = False) -> int:
    """Check the input, then run the viewer until the user quits."""
    entries, skipped = find_profiles(root, include_incomplete=include_incomplete)
    for path in skipped:
        print(f"neuron-profile: note: skipped incomplete profile {path}", file=sys.stderr)
    entries, systems = device_entries(entries)
    if not entries:
        raise ProfileError(system_only(root, "the viewer"))
    for entry in systems:  # a capture's top folder: show its device/ profiles, name its system/
        print(f"neuron-profile: note: {system_note(entry.path)}", file=sys.stderr)
    first = open_readable(entries[0].path)  # one that does not open fails here, before the TUI
    root_path = None
    if source_root is not None:
        root_path = Path(source_root)
        if not root_path.is_dir():
            raise ProfileError(f"{source_root}: --source-root is not a directory")
    if not is_terminal():
        raise ProfileError(
            "the interactive viewer needs a terminal; use --output-format summary-text "
            "(or summary-json, json, perfetto) in scripts"
        )
    from explorer.viewer.data import ProfileData
    from explorer.viewer.viewer_app import ViewerApp, profile_name

    data = ProfileData(first, profile_name(entries[0], first.metadata), root_path)
    ViewerApp(entries, source_root=root_path, first=data).run()
    return EXIT_OK


def is_terminal() -> bool:
    """A Textual app needs a terminal on both ends; a pipe gets the one-line hint instead."""
    return sys.stdout.isatty() and sys.stdin.isatty()
