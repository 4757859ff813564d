"""``neuron-profile``: work with Neuron Explorer profile directories from the command line.

    neuron-profile validate out/bert            # schema conformance report; exit 0 conformant, 1 not
    neuron-profile validate out/bert --json     # the same report as one JSON object
    neuron-profile validate out/run/device      # every profile below a dataset folder
    neuron-profile query out/bert "SELECT opcode, count(*) FROM Instruction GROUP BY 1"
    neuron-profile query out/run/device "SELECT core, ..." --format csv -o result.csv
    neuron-profile view out/bert --output-format summary-text      # or summary-json, json, perfetto
    neuron-profile analyze out/bert             # why: critical path, idle by cause, stragglers

Each subcommand is a small class (name, help, ``prepare_parser``, ``run``) in ``COMMANDS``, in the
style of memray's CLI; ``explorer/profile_cli.py`` adds ``capture`` the same way. Bad input (a missing
or corrupt profile, a bad or writing query) prints one line on stderr and exits 2 -- never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from neuronscope.cli_kit import (
    EXIT_BAD_INPUT,
    EXIT_FINDINGS,
    EXIT_OK,
    Command,
    LazyCommand,
    OneLineParser,
    chosen_command,
    command_parser,
    run_command,
)

if TYPE_CHECKING:
    from formats.schema import Schema

# the commands' work (PyArrow, DuckDB, the analyses) is imported in their ``run``, so that building
# the parser -- all ``neuron-profile --help`` does -- costs only this module


class ValidateCommand:
    """Check a profile directory against the profile schema."""

    name = "validate"
    help = "check a profile directory against the Neuron Explorer profile schema"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("profile", metavar="DIR",
                            help="profile directory (<Table>.parquet files), or a folder of them: every "
                                 "profile below it is validated")
        parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
        parser.add_argument("--schema", metavar="JSON",
                            help="profile-schema.json to check against (default: the reference copy "
                                 "if present, else the built-in definition)")
        parser.add_argument("-q", "--quiet", action="store_true", help="print only errors and the verdict")

    def run(self, args: argparse.Namespace) -> int:
        from formats.dataset import find_profiles
        from formats.reader import ProfileError
        from formats.schema import Schema
        from formats.validate import validate

        schema = None
        if args.schema:
            try:
                schema = Schema.from_json(args.schema)
            except (OSError, ValueError, KeyError) as exc:
                raise ProfileError(f"{args.schema}: not a usable profile-schema.json: {exc}") from exc
        entries, _ = find_profiles(args.profile, include_incomplete=True)
        if len(entries) == 1 and entries[0].name == ".":
            report = validate(args.profile, schema)
            if args.json:
                print(json.dumps(report.to_dict()))
            else:
                self._print(report.lines(), args.quiet)
            return EXIT_OK if report.conformant else EXIT_FINDINGS
        return self._run_tree(args, schema)

    def _run_tree(self, args: argparse.Namespace, schema: Schema | None) -> int:
        """A dataset folder: every profile below it, each report in turn, then one verdict line."""
        from formats.validate import validate_tree

        results = []
        for entry in validate_tree(args.profile, schema):
            results.append(entry)
            if args.json:
                continue
            if entry.report is not None:
                self._print(entry.report.lines(), args.quiet)
            else:
                print(f"UNREADABLE {entry.error}")
        unreadable = sum(1 for e in results if e.report is None)
        failing = sum(1 for e in results if e.report is not None and not e.report.conformant)
        if args.json:
            print(json.dumps({"path": str(args.profile), "profiles": [e.to_dict() for e in results],
                              "conformant": not unreadable and not failing}))
        else:
            print(f"{len(results)} profiles under {args.profile}: {len(results) - unreadable - failing} "
                  f"conformant, {failing} NOT conformant, {unreadable} unreadable")
        if unreadable:
            first = next(e for e in results if e.report is None)
            print(f"neuron-profile: error: {unreadable} of {len(results)} profiles under {args.profile} "
                  f"cannot be read (first: {first.error})", file=sys.stderr)
            return EXIT_BAD_INPUT
        return EXIT_FINDINGS if failing else EXIT_OK

    @staticmethod
    def _print(lines: Iterator[str], quiet: bool) -> None:
        for line in lines:
            if quiet and not line.startswith("ERROR") and "conformant:" not in line:
                continue
            print(line)


class QueryCommand:
    """Read-only SQL over a profile or a folder of profiles (a capture's ``device/`` dataset)."""

    name = "query"
    help = "run a read-only SQL query over a profile (or a folder of profiles) and print or save the result"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("profile", metavar="DIR",
                            help="profile directory, or a folder of them (hive partitions such as "
                                 "model=<m>/core=<c>/execution=<k> become columns)")
        parser.add_argument("sql", metavar="SQL", nargs="?",
                            help="one SELECT statement over the tables (views: Instruction, DmaPacket, "
                                 "Summary, ...); omit it to list the tables")
        parser.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table",
                            help="table (default, printed), or csv/json/parquet written to -o (csv and "
                                 "json go to stdout without -o)")
        parser.add_argument("-o", "--output", metavar="FILE", help="write the result here")
        parser.add_argument("--max-rows", type=int, default=100, metavar="N",
                            help="rows printed in table format (default 100)")
        parser.add_argument("--include-incomplete", action="store_true",
                            help="also read interrupted captures (<dir>.incomplete)")

    def run(self, args: argparse.Namespace) -> int:
        from formats.query import open_query
        from formats.query_output import list_tables, write_result
        from formats.reader import ProfileError

        if args.format == "parquet" and not args.output:
            raise ProfileError("--format parquet writes a file: give it with -o FILE")
        with open_query(args.profile, include_incomplete=args.include_incomplete) as session:
            for skipped in session.skipped:
                print(f"neuron-profile: note: skipped incomplete profile {skipped}", file=sys.stderr)
            if args.sql is None:
                list_tables(session)
                return EXIT_OK
            write_result(session, args.sql, args.format, args.output, args.max_rows)
        return EXIT_OK


class ViewOutputCommand:
    """Non-interactive views of a profile: the real tool's summary and export formats."""

    name = "view"
    help = "show a profile's summary (summary-text, summary-json) or export it (json, perfetto)"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from formats.view_formats import VIEW_FORMATS

        parser.add_argument("profile", metavar="DIR", help="profile directory, or a folder of them")
        VIEW_FORMATS.add_option(parser)
        parser.add_argument("--output-file", "-o", metavar="PATH",
                            help="where to write (json/perfetto default: device_profile_<name>.json/.pftrace "
                                 "in the current directory; '-' = stdout for the text formats and json)")
        parser.add_argument("--recompute", action="store_true",
                            help="compute the Summary from the event tables even if the profile has one")
        parser.add_argument("--include-incomplete", action="store_true",
                            help="also read interrupted captures (<dir>.incomplete)")
        parser.add_argument("--all-flows", action="store_true",
                            help="perfetto: an arrow for every dependency edge (default: per instruction or "
                                 "DMA transfer only the one it waited on last)")

    def run(self, args: argparse.Namespace) -> int:
        if args.output_format is None:
            # formats alone (python -m formats.profile_commands): the viewer is the explorer's, which the
            # installed neuron-profile assembles (explorer/profile_cli.py)
            print("neuron-profile view: this formats-only command has no interactive viewer (the installed "
                  "neuron-profile opens it); use --output-format summary-text (or summary-json, json, "
                  "perfetto)", file=sys.stderr)
            return EXIT_BAD_INPUT
        from formats.view_output import render

        render(args.profile, args.output_format, args.output_file, recompute=args.recompute,
               include_incomplete=args.include_incomplete, all_flows=args.all_flows)
        return EXIT_OK


ANALYZE_HELP = "explain a profile: critical path, idle time by cause, stragglers across ranks"

COMMANDS: list[Command] = [ValidateCommand(), QueryCommand(), ViewOutputCommand(),
                           LazyCommand("analyze", ANALYZE_HELP, "formats.analyze_command:AnalyzeCommand")]


def build_parser(commands: Sequence[Command] = COMMANDS,
                 prepare: str | bool | None = True) -> argparse.ArgumentParser:
    """The ``neuron-profile`` parser; ``prepare`` as ``cli_kit.command_parser`` (True: every
    subcommand's options)."""
    return command_parser("neuron-profile", __doc__.split("\n\n")[0], commands, OneLineParser, prepare)


def _note_captures(args: argparse.Namespace) -> None:
    """Before a view or query: one stderr line per profile read that is incomplete or holds a
    warm-up execution, so a partial capture is never read as a whole one."""
    if getattr(args, "command", None) not in ("view", "query") or not getattr(args, "profile", None):
        return
    from formats.dataset import capture_notes

    notes = capture_notes(args.profile, include_incomplete=bool(getattr(args, "include_incomplete", False)))
    for note in notes[:3]:
        print(f"neuron-profile: note: {note}", file=sys.stderr)
    if len(notes) > 3:
        print(f"neuron-profile: note: ... and {len(notes) - 3} more such profiles", file=sys.stderr)


def run_cli(argv: Sequence[str] | None, commands: Sequence[Command],
            bad_input: tuple[type[BaseException], ...] = (OSError,),
            interrupted: str = "interrupted") -> int:
    """Parse ``argv`` against ``commands`` and run one; a ``CliError`` (``ProfileError`` is one) or a
    ``bad_input`` error (an OSError such as an output file that cannot be written) becomes one line
    and exit 2, Ctrl-C exits 130 (``neuronscope.cli_kit.run_command``)."""
    args = build_parser(commands, chosen_command(argv, commands)).parse_args(argv)

    def body() -> int:
        _note_captures(args)
        return int(args.handler.run(args))

    return run_command("neuron-profile", body, bad_input=bad_input, interrupted=interrupted)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(argv, COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
