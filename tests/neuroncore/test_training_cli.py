"""``neuroncore run --workload <training workload>`` through the real entry point: each of the four
training workloads runs (small configs), with a layout, and bad layouts are one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NEURONSCOPE_")}
    environment.update(COLUMNS="160", NEURONSCOPE_CONFIG=str(REPO / "nonexistent-test-config.toml"),
                       NEURONSCOPE_LIVE="0")
    return subprocess.run([sys.executable, "-m", "neuroncore.cli", *args], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("workload, args", [
    ("llama-train", ["--tp", "2", "--pp", "2", "--zero1", "--set", "seq=128", "--set", "global_batch=32"]),
    ("bert-pretrain", ["--set", "micro_batch=2"]),
    ("gpt-train", ["--tp", "4", "--set", "seq=128"]),
    ("vit-finetune", ["--set", "micro_batch=2", "--nodes", "2"]),
])
def test_training_workloads_run_from_the_cli(workload: str, args: list[str]) -> None:
    done = run_cli("run", "--workload", workload, *args)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "training step" in out and "timing only" in out
    for level in ("forward", "backward", "pipeline", "gradient_sync", "optimizer"):
        assert level in out
    if "--nodes" in args:
        assert "2x trn1.32xlarge" in out and "dp 64" in out
    if "--zero1" in args:
        assert "ZeRO-1" in out and "overlapped with the backward" in out


@pytest.mark.parametrize("args, fragment", [
    (["--workload", "llama-train", "--tp", "3", "--set", "seq=128"], "tp 3 does not divide"),
    (["--workload", "llama-train", "--dp", "3", "--set", "seq=128"], "has 32 NeuronCores"),
    (["--workload", "bert-pretrain", "--preset", "bert-base"], "no preset 'bert-base'"),
    (["--workload", "gpt-train", "--set", "bogus=1"], "no option bogus"),
    (["--workload", "mlp", "--zero1"], "--zero1 applies to training workloads"),
])
def test_bad_training_arguments_are_one_line(args: list[str], fragment: str) -> None:
    done = run_cli("run", *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert fragment in lines[0]


def test_workloads_lists_the_training_workloads() -> None:
    done = run_cli("workloads")
    assert done.returncode == 0
    for name in ("llama-train", "bert-pretrain", "gpt-train", "vit-finetune", "llama3.1-70b"):
        assert name in done.stdout
