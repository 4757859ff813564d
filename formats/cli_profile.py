"""``neuron-profile``: work with Neuron Explorer profile directories from the command line.

    neuron-profile validate out/bert            # schema conformance report; exit 0 conformant, 1 not
    neuron-profile validate out/bert --json     # the same report as one JSON object

Each subcommand is a small class (name, help, ``prepare_parser``, ``run``) in ``COMMANDS``, in the
style of memray's CLI; later issues add ``query``, ``view`` and ``capture`` the same way. Bad input
prints one line on stderr and exits 2 -- never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Protocol

from formats.reader import ProfileError
from formats.schema import Schema

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


class Command(Protocol):
    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class ValidateCommand:
    """Check a profile directory against the profile schema."""

    name = "validate"
    help = "check a profile directory against the Neuron Explorer profile schema"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("profile", metavar="DIR", help="profile directory (<Table>.parquet files)")
        parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
        parser.add_argument("--schema", metavar="JSON",
                            help="profile-schema.json to check against (default: the reference copy "
                                 "if present, else the built-in definition)")
        parser.add_argument("-q", "--quiet", action="store_true", help="print only errors and the verdict")

    def run(self, args: argparse.Namespace) -> int:
        from formats.validate import ERROR, validate

        schema = None
        if args.schema:
            try:
                schema = Schema.from_json(args.schema)
            except (OSError, ValueError, KeyError) as exc:
                raise ProfileError(f"{args.schema}: not a usable profile-schema.json: {exc}") from exc
        report = validate(args.profile, schema)
        if args.json:
            print(json.dumps(report.to_dict()))
        else:
            for line in report.lines():
                if args.quiet and not line.startswith(ERROR.upper()) and "conformant:" not in line:
                    continue
                print(line)
        return EXIT_OK if report.conformant else EXIT_FINDINGS


COMMANDS: list[Command] = [ValidateCommand()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-profile", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.prepare_parser(child)
        child.set_defaults(handler=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler.run(args)
    except ProfileError as exc:
        print(f"neuron-profile: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("neuron-profile: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
