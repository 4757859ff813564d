"""``neuron-profile``: the one command for profiles -- capture them, check them, look at them.

    neuron-profile capture --workload bert-layer -o out/bert      # collectors.capture
    neuron-profile capture -o out/mine -- python my_script.py     # wrap any program
    neuron-profile run --workload bert-layer --duration 30        # load generator (collectors.loadgen)
    neuron-profile validate out/bert/device/...                   # formats.profile_commands
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

from collectors.capture import CaptureCommand
from collectors.loadgen import RunCommand
from collectors.whatif import WhatIfAnalyzeCommand
from explorer.viewer.view_command import ViewCommand
from formats import profile_commands as formats_cli
from formats.profile_commands import COMMANDS as FORMAT_COMMANDS
from neuronscope.cli_kit import Command

# formats' own ``view`` (summary and exports only) is replaced by the explorer's, which adds the
# interactive viewer as the default and hands --output-format to the formats' code; formats' own
# ``analyze`` by the collectors' one, which adds --what-if (re-simulation needs the capture)
COMMANDS: list[Command] = [CaptureCommand(), RunCommand(),
            *(ViewCommand() if c.name == "view" else WhatIfAnalyzeCommand() if c.name == "analyze" else c
              for c in FORMAT_COMMANDS)]


def build_parser() -> argparse.ArgumentParser:
    return formats_cli.build_parser(COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    # ProfileError and CaptureError are CliErrors; compile errors, sharding and unknown options are
    # ValueErrors; disk errors OSErrors: each is one line and exit 2 (neuronscope.cli_kit)
    return formats_cli.run_cli(argv, COMMANDS, (ValueError, OSError),
                               "interrupted; what was recorded is kept (marked incomplete)")


if __name__ == "__main__":
    sys.exit(main())
