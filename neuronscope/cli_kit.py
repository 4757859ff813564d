"""Argument parsing for the command-line tools: a usage mistake is one line on stderr, exit 2.

argparse prints the whole usage block before its error; scripts that wrap these tools (and the
project's rule for bad input) want one line that says what was wrong. ``--help`` is unchanged.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``<prog>: <message>`` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


__all__ = ["OneLineParser"]
