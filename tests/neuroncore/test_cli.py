"""The ``neuroncore`` command line: through its real entry point (a subprocess) and in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from neuroncore import cli

REPO = Path(__file__).resolve().parents[2]
ENGINE_ROWS = ("Tensor", "Vector", "Scalar", "GpSimd", "Sync", "DMA")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real entry point, with no user settings leaking in (only those in ``env``)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NEURONSCOPE_")}
    environment.update(COLUMNS="120", NEURONSCOPE_CONFIG=str(REPO / "nonexistent-test-config.toml"))
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "neuroncore.cli", *args], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(stderr: str, *fragments: str) -> None:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("neuroncore: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture
def isolated_config(monkeypatch, tmp_path):
    monkeypatch.delenv("NEURONSCOPE_INSTANCE", raising=False)
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("COLUMNS", "120")


# -- through the real entry point ----------------------------------------------------------------------


def test_run_mlp_prints_the_engine_table():
    proc = run_cli("run", "--workload", "mlp", "--set", "batch=16", "--set", "d_model=64",
                   "--set", "d_ff=128")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert "device time" in out
    for row in ENGINE_ROWS:
        assert row in out, row
    assert "mlp" in out and "batch=16" in out and "d_model=64" in out and "d_ff=128" in out
    assert "trn1.2xlarge" in out and "NeuronCore-v2" in out
    assert "numerics + timing" in out
    assert "outputs: [16, 64]" in out
    assert "MFU" in out


def test_run_matmul_timing_only():
    proc = run_cli("run", "-w", "matmul", "--timing-only")
    assert proc.returncode == 0, proc.stderr
    assert "timing only" in proc.stdout and "device time" in proc.stdout
    assert "outputs:" not in proc.stdout
    assert "m=512" in proc.stdout  # the default options are shown


def test_workloads_lists_all_four():
    proc = run_cli("workloads")
    assert proc.returncode == 0, proc.stderr
    for name in ("matmul", "mlp", "bert-layer", "llama-decode"):
        assert name in proc.stdout
    assert "llama2-7b" in proc.stdout and "nki-tutorial" in proc.stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--set", "frobnicate=1"], ["no option frobnicate"]),
        (["--set", "m"], ["--set expects KEY=VALUE", "'m'"]),
        (["--set", "=4"], ["--set expects KEY=VALUE"]),
        (["--preset", "gpt-5"], ["no preset 'gpt-5'", "nki-tutorial"]),
        (["--set", "m=0"], ["[1024, 0]"]),
        (["--set", "k=-5"], ["-5"]),
    ],
    ids=["unknown-key", "no-equals", "no-key", "unknown-preset", "zero-dim", "negative-dim"],
)
def test_bad_input_is_one_line_and_exit_2(args, fragments):
    proc = run_cli("run", "-w", "matmul", "--timing-only", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert_one_line_error(proc.stderr, *fragments)


def test_env_instance_is_used():
    proc = run_cli("run", "-w", "mlp", "--set", "batch=8", "--set", "d_model=32", "--set", "d_ff=64",
                   "--timing-only", env={"NEURONSCOPE_INSTANCE": "trn2.48xlarge"})
    assert proc.returncode == 0, proc.stderr
    assert "trn2.48xlarge" in proc.stdout and "NeuronCore-v3" in proc.stdout


def test_console_script_module_has_main():
    # the installed ``neuroncore`` script calls neuroncore.cli:main (pyproject [project.scripts])
    text = (REPO / "pyproject.toml").read_text()
    assert 'neuroncore = "neuroncore.cli:main"' in text
    assert callable(cli.main)


# -- in-process ----------------------------------------------------------------------------------------


def test_main_in_process_run(isolated_config, capsys):
    code = cli.main(["run", "-w", "mlp", "--set", "batch=8", "--set", "d_model=32", "--set", "d_ff=64",
                     "--dtype", "fp32"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    assert "dtype=fp32" in out and "device time" in out
    for row in ENGINE_ROWS:
        assert row in out


def test_main_in_process_instance_and_core(isolated_config, capsys):
    code = cli.main(["run", "-w", "mlp", "--set", "batch=8", "--set", "d_model=32", "--set", "d_ff=64",
                     "--instance", "inf2.24xlarge", "--core", "11", "--timing-only"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "inf2.24xlarge core 11" in out


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["run", "-w", "mlp", "--set", "width=3"], ["no option width"]),
        (["run", "-w", "llama-decode", "--preset", "llama9"], ["no preset 'llama9'", "llama2-7b"]),
        (["run", "-w", "mlp", "--set", "batch=0", "--timing-only"], ["cannot place", "0"]),
        (["run", "-w", "mlp", "--set", "batch=2.5", "--timing-only"], ["option batch expects int", "2.5"]),
        (["run", "-w", "mlp", "--set", "batch=many", "--timing-only"], ["option batch", "'many'"]),
        (["run", "-w", "matmul", "--set", "transpose_lhs=maybe", "--timing-only"],
         ["option transpose_lhs expects bool", "'maybe'"]),
        (["run", "-w", "mlp", "--core", "2", "--timing-only"], ["cores 0..1, not 2"]),
        (["run", "-w", "llama-decode", "--set", "heads=6", "--timing-only"],
         ["hidden (512) must be a positive multiple of heads (6)"]),
        (["run", "-w", "llama-decode", "--set", "heads=0", "--timing-only"], ["heads (0)"]),
        (["run", "-w", "llama-decode", "--set", "kv_heads=0", "--timing-only"], ["kv_heads (0)"]),
        (["run", "-w", "bert-layer", "--set", "heads=0", "--timing-only"], ["heads (0)"]),
    ],
    ids=["unknown-key", "unknown-preset", "zero-batch", "fractional", "not-a-number", "not-a-flag",
         "bad-core", "heads-not-dividing", "zero-heads", "zero-kv-heads", "bert-zero-heads"],
)
def test_main_in_process_errors(isolated_config, capsys, args, fragments):
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err, *fragments)


def test_bad_config_is_an_error_not_a_traceback(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("NEURONSCOPE_INSTANCE", raising=False)
    path = tmp_path / "config.toml"
    path.write_text('instance = "trn3.huge"\n')
    monkeypatch.setenv("NEURONSCOPE_CONFIG", str(path))
    assert cli.main(["run", "-w", "mlp", "--set", "batch=4", "--timing-only"]) == 2
    assert_one_line_error(capsys.readouterr().err, "trn3.huge")


def test_argparse_usage_errors_exit_2(isolated_config, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "-w", "resnet"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2


def test_workloads_in_process(capsys):
    assert cli.main(["workloads"]) == 0
    out = capsys.readouterr().out
    for name in ("matmul", "mlp", "bert-layer", "llama-decode"):
        assert name in out


def test_precision_options_that_change_nothing_say_so():
    """matmul is bf16 by default: auto-cast to tf32 (FP32 ops only) and int8 weight-only (its
    right-hand side is an input, not a weight) leave the program as it is, and the run says so instead
    of timing the same program silently; on FP32 the cast applies and there is no note. Auto-cast to
    fp8 leaves the bf16 matmul alone as neuronx-cc does (FP32 operations only) and says so;
    --fp8-matmuls casts it."""
    cast = run_cli("run", "-w", "matmul", "--timing-only", "--auto-cast-type", "tf32",
                   "--set", "m=128", "--set", "k=128", "--set", "n=128", env={"COLUMNS": "200"})
    assert cast.returncode == 0, cast.stderr
    assert "change nothing: auto-cast casts FP32 ops" in cast.stdout
    fp8 = run_cli("run", "-w", "matmul", "--timing-only", "--auto-cast-type", "fp8_e4m3",
                  "--set", "m=128", "--set", "k=128", "--set", "n=128", env={"COLUMNS": "200"})
    assert fp8.returncode == 0 and "change nothing: auto-cast casts FP32 ops" in fp8.stdout
    fp8_matmuls = run_cli("run", "-w", "matmul", "--timing-only", "--fp8-matmuls",
                          "--set", "m=128", "--set", "k=128", "--set", "n=128", env={"COLUMNS": "200"})
    assert fp8_matmuls.returncode == 0 and "change nothing" not in fp8_matmuls.stdout
    assert "matmuls in fp8_e4m3" in fp8_matmuls.stdout
    quant = run_cli("run", "-w", "matmul", "--timing-only", "--quantize", "int8-weight-only",
                    "--set", "m=128", "--set", "k=128", "--set", "n=128", env={"COLUMNS": "200"})
    assert quant.returncode == 0 and "int8 weight-only quantises" in quant.stdout
    fp32 = run_cli("run", "-w", "matmul", "--timing-only", "--auto-cast-type", "fp8_e4m3", "--dtype", "fp32",
                   "--set", "m=128", "--set", "k=128", "--set", "n=128", env={"COLUMNS": "200"})
    assert fp32.returncode == 0 and "change nothing" not in fp32.stdout


def test_run_reports_power_throttling_on_trn2_only():
    """A trn2 run of the MLP prints its throttling (periods, extra matmul time); trn1 never throttles;
    --prefetch-weights shows in the options line."""
    trn2 = run_cli("run", "-w", "mlp", "--timing-only", "--instance", "trn2.48xlarge", "--prefetch-weights",
                   env={"COLUMNS": "200"})
    assert trn2.returncode == 0, trn2.stderr
    # (how many periods is the compiler's schedule: 3 before this round's matmul orientation, 1 after)
    assert re.search(r"power throttling: [1-9]\d* periods?", trn2.stdout) and "matmuls ran" in trn2.stdout
    assert "weights prefetched a layer ahead" in trn2.stdout and "auto-cast" not in trn2.stdout
    trn1 = run_cli("run", "-w", "mlp", "--timing-only", "--instance", "trn1.2xlarge", env={"COLUMNS": "200"})
    assert trn1.returncode == 0 and "power throttling" not in trn1.stdout


def test_no_power_throttling_turns_trn2_throttling_off():
    """``neuroncore run --no-power-throttling`` (the option ``neuron-profile capture`` has, one
    definition in neuroncore/cli_options.py): the trn2 MLP that throttles above runs without it;
    a training workload refuses it in one line."""
    off = run_cli("run", "-w", "mlp", "--timing-only", "--instance", "trn2.48xlarge", "--no-power-throttling",
                  env={"COLUMNS": "200"})
    assert off.returncode == 0, off.stderr
    assert "device time" in off.stdout and "power throttling" not in off.stdout
    train = run_cli("run", "-w", "llama-train", "--preset", "llama2-7b", "--no-power-throttling")
    assert train.returncode == 2
    assert_one_line_error(train.stderr, "--no-power-throttling", "inference workloads")


def test_run_and_capture_share_their_compile_options():
    """The options both commands have are the same definitions (choices and help), not copies."""
    from collectors.capture import CaptureCommand

    def options(parser) -> dict[str, tuple]:
        return {a.option_strings[0]: (a.choices, a.help) for a in parser._actions if a.option_strings}

    run = options(cli.build_parser()._subparsers._group_actions[0].choices["run"])
    capture_parser = cli.OneLineParser(prog="capture")
    CaptureCommand().prepare_parser(capture_parser)
    capture = options(capture_parser)
    for flag in ("--auto-cast", "--auto-cast-type", "--quantize", "--prefetch-weights", "--fp8-matmuls",
                 "--no-power-throttling"):
        assert run[flag] == capture[flag], flag
