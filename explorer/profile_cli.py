"""``neuron-profile``: the one command for profiles -- capture them, check them, look at them.

    neuron-profile capture --workload bert-layer -o out/bert      # collectors.capture
    neuron-profile capture -o out/mine -- python my_script.py     # wrap any program
    neuron-profile run --workload bert-layer --duration 30        # load generator (collectors.loadgen)
    neuron-profile validate out/bert/device/...                   # formats.profile_commands
    neuron-profile view out/bert/device                           # interactive viewer (explorer.viewer)

Subcommands are small classes (``name``, ``help``, ``prepare_parser``, ``run``) contributed by the
package that owns the work, memray-style; this module only assembles them, because it is the one
layer allowed to import collectors, formats and the explorer alike. Each is a
``cli_kit.LazyCommand``: its module (the core, the recorder, the viewer) is imported only when that
subcommand runs, so ``neuron-profile --help`` costs a few tens of milliseconds. Bad input prints one
line on stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from formats import profile_commands as formats_cli
from formats.profile_commands import COMMANDS as FORMAT_COMMANDS
from neuronscope.cli_kit import Command, LazyCommand

CAPTURE_HELP = "run a built-in workload or any program and record device and system profiles"
RUN_HELP = "keep simulated NeuronCores busy with a built-in workload (for neuron-top / neuron-monitor)"
VIEW_HELP = ("look at a profile: the interactive viewer (default), or its summary (summary-text, "
             "summary-json) or an export (json, perfetto) with --output-format")

# formats' own ``view`` (summary and exports only) is replaced by the explorer's, which adds the
# interactive viewer as the default and hands --output-format to the formats' code; formats' own
# ``analyze`` by the collectors' one, which adds --what-if (re-simulation needs the capture)
_REPLACED: dict[str, Command] = {
    "view": LazyCommand("view", VIEW_HELP, "explorer.viewer.view_command:ViewCommand"),
    "analyze": LazyCommand("analyze", formats_cli.ANALYZE_HELP, "collectors.whatif:WhatIfAnalyzeCommand"),
}
COMMANDS: list[Command] = [LazyCommand("capture", CAPTURE_HELP, "collectors.capture:CaptureCommand"),
                           LazyCommand("run", RUN_HELP, "collectors.loadgen:RunCommand"),
                           *(_REPLACED.get(c.name, c) for c in FORMAT_COMMANDS)]


def build_parser(prepare: str | bool | None = True) -> argparse.ArgumentParser:
    """The whole parser (``prepare``: as ``cli_kit.command_parser``; True builds every subcommand)."""
    return formats_cli.build_parser(COMMANDS, prepare)


def main(argv: Sequence[str] | None = None) -> int:
    # ProfileError and CaptureError are CliErrors; compile errors, sharding and unknown options are
    # ValueErrors; disk errors OSErrors: each is one line and exit 2 (neuronscope.cli_kit). The
    # parser builds only the chosen subcommand's options (formats_cli.run_cli)
    return formats_cli.run_cli(argv, COMMANDS, (ValueError, OSError),
                               "interrupted; what was recorded is kept (marked incomplete)")


if __name__ == "__main__":
    sys.exit(main())
