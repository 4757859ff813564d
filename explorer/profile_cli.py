"""``neuron-profile``: the one command for profiles -- capture them, check them, look at them.

    neuron-profile capture --workload bert-layer -o out/bert      # collectors.capture
    neuron-profile capture -o out/mine -- python my_script.py     # wrap any program
    neuron-profile run --workload bert-layer --duration 30        # load generator (collectors.loadgen)
    neuron-profile validate out/bert/device/...                   # formats.cli_profile
    neuron-profile view out/bert/device                           # interactive viewer (explorer.viewer)

Subcommands are small classes (``name``, ``help``, ``prepare_parser``, ``run``) contributed by the
package that owns the work, memray-style; this module only assembles them, because it is the one
layer allowed to import collectors, formats and the explorer alike. Bad input prints one line on
stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collectors.capture import CaptureCommand, CaptureError
from collectors.loadgen import RunCommand
from explorer.viewer.cli import ViewCommand
from formats.cli_profile import COMMANDS as FORMAT_COMMANDS
from formats.cli_profile import EXIT_BAD_INPUT
from formats.reader import ProfileError

# formats' own ``view`` (summary and exports only) is replaced by the explorer's, which adds the
# interactive viewer as the default and hands --output-format to the formats' code
COMMANDS = [CaptureCommand(), RunCommand(),
            *(ViewCommand() if c.name == "view" else c for c in FORMAT_COMMANDS)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-profile", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        command.prepare_parser(child)
        child.set_defaults(handler=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler.run(args))
    except (ProfileError, CaptureError) as exc:
        print(f"neuron-profile: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ValueError, OSError) as exc:  # compile errors, sharding, unknown options, disk errors
        print(f"neuron-profile: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("neuron-profile: interrupted; what was recorded is kept (marked incomplete)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
