"""``neuronscope.cli_kit``: the one error type, the renderer registry, and one-line usage errors in
every tool that uses them (through their real entry points)."""

from __future__ import annotations

import pytest

from explorer import ls
from formats.view_formats import VIEW_FORMATS
from neuroncore import cli as neuroncore_cli
from neuronscope.cli_kit import EXIT_BAD_INPUT, CliError, OneLineParser, Renderers, run_command


def test_run_command_prints_one_line_and_the_errors_exit_code(capsys):
    def fails() -> int:
        raise CliError("out/x: no profile here\n(second line)", exit_code=3)

    assert run_command("tool", fails) == 3
    assert capsys.readouterr().err == "tool: error: out/x: no profile here (second line)\n"
    assert run_command("tool", lambda: int("x"), bad_input=(ValueError,)) == EXIT_BAD_INPUT

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_command("tool", interrupted, interrupted="stopped") == 130
    assert capsys.readouterr().err.splitlines()[-1] == "tool: stopped"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        run_command("tool", lambda: 1 // 0)


def test_renderers_register_once_and_feed_the_option():
    renderers: Renderers[str] = Renderers("demo")
    renderers.register("text", "plain text")("T")
    renderers.register("json", "one document")("J")
    assert renderers.names() == ("text", "json") and renderers.get("json") == "J" and "text" in renderers
    with pytest.raises(ValueError, match="registered twice"):
        renderers.register("json", "again")("X")
    with pytest.raises(CliError, match="unknown output format 'csv'; known: text, json"):
        renderers.get("csv")
    parser = OneLineParser(prog="demo")
    renderers.add_option(parser, default="text")
    assert parser.parse_args([]).output_format == "text"
    assert "json: one document" in parser.format_help()


def test_view_formats_are_the_registry():
    assert VIEW_FORMATS.names() == ("summary-text", "summary-json", "json", "perfetto")
    assert ls.RENDERERS.names() == ("table", "json")


@pytest.mark.parametrize(("main", "argv"), [
    (neuroncore_cli.main, ["run", "--workload", "no-such"]),
    (neuroncore_cli.main, ["run", "--workload", "matmul", "--instance", "trn9.huge"]),
    (ls.main, ["--output-format", "yaml"]),
])
def test_usage_mistakes_are_one_line_and_exit_2(capsys, main, argv):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and "usage:" not in err, err


def test_neuron_profile_usage_mistake_is_one_line(capsys):
    from explorer.profile_cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["view", "out/x", "--output-format", "yaml"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'yaml'" in err, err


def test_domain_errors_are_cli_errors():
    from collectors.capture import CaptureError
    from formats.reader import ProfileError

    assert issubclass(ProfileError, CliError) and issubclass(CaptureError, CliError)
    assert issubclass(CaptureError, ValueError)  # callers that caught ValueError still do


def test_a_reader_that_goes_away_is_no_error(capsys):
    """``neuron-profile analyze DIR | head``: the pipe closes early; the command ends quietly, 0."""

    def writes_to_a_closed_pipe() -> int:
        raise BrokenPipeError(32, "Broken pipe")

    assert run_command("tool", writes_to_a_closed_pipe, bad_input=(OSError,)) == 0
    assert capsys.readouterr().err == ""


HEAVY = ("pyarrow", "duckdb", "torch", "numba", "textual", "neuroncore.compiler", "neuroncore.runtime",
         "collectors.capture", "formats.reader")


@pytest.mark.parametrize("module", ["explorer.profile_cli", "neuroncore.cli"])
def test_help_imports_no_subcommand(module):
    """``neuron-profile --help`` / ``neuroncore --help`` list the subcommands without importing
    their work (it cost ~0.9 and ~0.6 CPU-s per call when every subcommand's module was imported)."""
    import subprocess
    import sys

    code = (f"import sys; from {module} import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            f"print('LOADED:' + ' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "workloads" in proc.stdout or "capture" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "LOADED:"


def test_lazy_commands_declare_their_classes_help():
    """Each lazily loaded subcommand's help (listed by --help before its module loads) is the
    command class's own."""
    from explorer.profile_cli import COMMANDS
    from neuronscope.cli_kit import LazyCommand

    lazy = [c for c in COMMANDS if isinstance(c, LazyCommand)]
    assert {c.name for c in lazy} >= {"capture", "run", "view", "analyze"}
    for command in lazy:
        assert command.load().help == command.help, command.name
        assert command.load().name == command.name


def test_chosen_subcommand_alone_gets_its_options(capsys):
    """``neuron-profile capture --help`` builds capture's options; a subcommand not chosen is listed
    but not prepared."""
    from explorer.profile_cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["capture", "--help"])
    assert exit_.value.code == 0
    assert "--no-power-throttling" in capsys.readouterr().out
