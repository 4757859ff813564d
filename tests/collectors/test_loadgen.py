"""``neuron-profile run``: the load generator keeps cores busy and shows up in the live state."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from collectors.livereader import read_live_state

REPO = Path(__file__).resolve().parents[2]


def start(*args: str, live_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NEURONSCOPE_LIVE": "1",
           "NEURONSCOPE_LIVE_DIR": str(live_dir), "NEURONSCOPE_LIVE_PERIOD": "0.1"}
    return subprocess.Popen([sys.executable, "-m", "explorer.profile_cli", "run", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_publishes_busy_cores_while_it_runs(tmp_path):
    proc = start("--workload", "llama-decode", "--instance", "trn1.32xlarge", "--tp", "2", "--replicas", "2",
                 "--duration", "20", live_dir=tmp_path)
    try:
        seen: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(seen) < 4:
            for state in read_live_state(tmp_path):
                if state.pid == proc.pid:
                    seen = {i: c.executions for i, c in state.cores.items() if c.executions}
            time.sleep(0.1)
        assert sorted(seen) == [0, 1, 2, 3]  # two tensor-parallel replicas of two ranks each
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_run_for_a_duration_then_report(tmp_path):
    proc = start("--workload", "mlp", "--set", "batch=8", "--set", "d_model=64", "--set", "d_ff=128",
                 "--duration", "0.5", "--utilisation", "0.5", live_dir=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.startswith("ran mlp: ") and "executions in" in out and "device busy" in out


def test_run_bad_input(tmp_path):
    for args, message in ((["--workload", "mlp", "--utilisation", "0"], "--utilisation must be in (0, 1]"),
                          (["--workload", "mlp", "--replicas", "5", "--instance", "trn1.2xlarge"],
                           "5 replicas of tp_degree 1 does not fit trn1.2xlarge")):
        proc = start(*args, live_dir=tmp_path)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2
        assert err.strip().splitlines() == [err.strip()] and message in err
