"""Command-line plumbing shared by every tool: one parser rule, one error type, output renderers.

    parser = OneLineParser(prog="neuron-ls")            # a usage mistake: one line, exit 2
    raise CliError("out/bert: not a profile")           # any command: one line on stderr, exit 2
    RENDERERS = Renderers[Callable[..., None]]("neuron-ls")
    @RENDERERS.register("json", "one JSON document")    # --output-format choices come from here
    def render_json(...): ...
    return run_command("neuron-ls", lambda: body(args), bad_input=(ValueError,))

Used by neuroncore, neuron-profile (formats.profile_commands + explorer.profile_cli), neuron-ls,
neuron-top, neuron-monitor(-prometheus) and neuron-explorer. Why here: the rule "every bad input is
one clear line and a non-zero exit, never a traceback" is the same for all of them, and the core may
not import the packages above it; this package imports nothing of ours.

Output renderers are a registry (pyinstrument keeps its renderers the same way): a format is
registered once, with its help text, and ``--output-format``'s choices, its help and the dispatch
all read that one registry, so a new format is one function and one decorator.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, NoReturn, Protocol, TypeVar

EXIT_OK = 0
EXIT_FINDINGS = 1  # the command worked and found something wrong (validate, check)
EXIT_BAD_INPUT = 2  # usage mistakes and unusable input
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

F = TypeVar("F")


class CliError(Exception):
    """The one error type a command raises for bad input or an unusable environment.

    Its message is the whole line shown (after ``<prog>: error: ``); ``exit_code`` is the status.
    Domain errors that reach users through a command line (``formats.reader.ProfileError``,
    ``collectors.capture.CaptureError``) derive from it, so one handler prints them all."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``<prog>: <message>`` and exit status 2.

    argparse prints the whole usage block before its error; scripts that wrap these tools (and the
    project's rule for bad input) want one line that says what was wrong. ``--help`` is unchanged."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


class Command(Protocol):
    """A subcommand contributed by the package that owns its work (memray-style): ``neuron-profile``
    assembles ``capture`` (collectors), ``validate``/``query``/``view`` (formats, explorer)."""

    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class LazyCommand:
    """A subcommand whose module is imported only when the command is chosen.

    ``neuron-profile --help`` lists every subcommand; importing each one's module for that (capture
    brings the core, the recorder and PyArrow, view the Textual viewer) cost most of a second of CPU
    per call. The name and help are declared here; ``target`` (``"package.module:Class"``) is the
    command class, built on first use. A test checks the help equals the class's own."""

    def __init__(self, name: str, summary: str, target: str) -> None:
        self.name = name
        self.help = summary
        self.target = target
        self._loaded: Command | None = None

    def load(self) -> Command:
        """The command object itself (its module imported now)."""
        if self._loaded is None:
            module, _, attr = self.target.partition(":")
            self._loaded = getattr(importlib.import_module(module), attr)()
        return self._loaded

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        self.load().prepare_parser(parser)

    def run(self, args: argparse.Namespace) -> int:
        return self.load().run(args)


def chosen_command(argv: Sequence[str] | None, commands: Sequence[Command]) -> str | None:
    """The subcommand ``argv`` names (its first word: these tools have no options before the
    subcommand but ``--help``), or None (``--help``, nothing, or a word that is no command)."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words and any(c.name == words[0] for c in commands):
        return words[0]
    return None


def command_parser(prog: str, description: str, commands: Sequence[Command],
                   parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
                   prepare: str | bool | None = True) -> argparse.ArgumentParser:
    """A parser with one subcommand per ``Command``; the chosen one is ``args.handler``.

    ``prepare``: True builds every subcommand's options; a name builds only that one's and None
    none (``chosen_command(argv, commands)``: the tool's ``--help`` lists names and helps only, so a
    ``LazyCommand``'s module is imported just for the command that runs)."""
    parser = parser_class(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands:
        child = sub.add_parser(command.name, help=command.help, description=command.help)
        if prepare is True or prepare == command.name:
            command.prepare_parser(child)
        child.set_defaults(handler=command)
    return parser


def one_line(exc: BaseException) -> str:
    """An exception's message as one printable line (file names that are not UTF-8 included)."""
    text = str(exc) or type(exc).__name__
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return " ".join(text.splitlines())


def run_command(prog: str, body: Callable[[], int], *,
                bad_input: tuple[type[BaseException], ...] = (),
                interrupted: str = "interrupted") -> int:
    """Run a command's body: a ``CliError`` (or one of ``bad_input``) becomes one line on stderr and
    its exit code (2 for ``bad_input``); Ctrl-C is one line and 130. Anything else is a bug and
    keeps its traceback."""
    try:
        return int(body())
    except BrokenPipeError:  # the reader went away (``| head``): what it wanted, it has
        quiet_stdout()
        return 0
    except CliError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except bad_input as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED


def quiet_stdout() -> None:
    """After stdout's reader went away: point stdout at /dev/null, so the interpreter's final flush
    does not fail a second time with a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@dataclass(frozen=True)
class Renderer(Generic[F]):
    name: str
    description: str
    render: F


class Renderers(Generic[F]):
    """Output formats by name, in registration order; ``F`` is the renderers' call signature."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self._by_name: dict[str, Renderer[F]] = {}

    def register(self, name: str, description: str) -> Callable[[F], F]:
        def add(render: F) -> F:
            if name in self._by_name:
                raise ValueError(f"{self.tool}: output format {name!r} registered twice")
            self._by_name[name] = Renderer(name, description, render)
            return render

        return add

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[Renderer[F]]:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def get(self, name: str) -> F:
        """The renderer called ``name``; ``CliError`` naming the known ones otherwise."""
        found = self._by_name.get(name)
        if found is None:
            raise CliError(f"unknown output format {name!r}; known: {', '.join(self._by_name)}")
        return found.render

    def add_option(self, parser: argparse.ArgumentParser, *flags: str, default: str | None = None,
                   what: str = "output format") -> None:
        """``--output-format`` (or ``flags``) with the registered names as choices and their help."""
        listed = "; ".join(f"{r.name}: {r.description}" for r in self)
        parser.add_argument(*(flags or ("--output-format",)), choices=self.names(), default=default,
                            help=f"{what} ({listed})" + (f"; default {default}" if default else ""))


def add_instance_option(parser: argparse.ArgumentParser, description: str,
                        choices: Sequence[str] | None = None) -> None:
    """The ``--instance`` option every tool shares (simulated instance type)."""
    parser.add_argument("--instance", choices=sorted(choices) if choices else None, help=description)


__all__ = ["EXIT_BAD_INPUT", "EXIT_FINDINGS", "EXIT_INTERRUPTED", "EXIT_OK", "CliError", "Command",
           "LazyCommand", "OneLineParser", "Renderer", "Renderers", "add_instance_option", "chosen_command",
           "command_parser", "one_line", "quiet_stdout", "run_command"]
