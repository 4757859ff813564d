"""``neuron-top`` through its real entry point: ``--once`` text (exact for a fixed stream, by content
for live state) and every kind of bad command line, which is one line on stderr and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.top_frames import MONITOR_STREAM

REPO = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).parent / "snapshots"


def neuron_top(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "explorer.top", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(text)
    assert text == path.read_text()


def test_once_from_a_monitor_file_is_exact():
    result = neuron_top("--once", "--from-monitor", str(MONITOR_STREAM), "--width", "110")
    assert result.returncode == 0, result.stderr
    check_snapshot("top_once_monitor_trn1.txt", result.stdout)
    assert "ND3  ||||" in result.stdout and "[  --  ]" in result.stdout


def test_once_from_stdin_takes_the_first_report():
    first = MONITOR_STREAM.read_text().splitlines()[0]
    result = neuron_top("--once", "--from-monitor", "-", "--width", "100", stdin="garbage\n" + first + "\n")
    assert result.returncode == 0, result.stderr
    assert "(Avg: 54.31%, 5 of 32 cores)" in result.stdout and "line 1: not JSON" in result.stdout


def test_once_from_stdin_without_a_report_fails_in_one_line():
    result = neuron_top("--once", "--from-monitor", "-", stdin="not json\n")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no neuron-monitor report" in result.stderr


def _state_doc(pid: int, now: float) -> dict:
    start = psutil.Process(pid).create_time()
    return {"format": "neuronscope-live", "version": 1, "pid": pid, "start_time": start,
            "tag": "svc", "command": "python serve.py", "user": "tester", "runtime_version": "0.1.0",
            "period_s": 0.5, "started_at": now - 5, "sampled_at": now, "sequence": 1,
            "host": {"cpu_user_s": 0.5, "cpu_system_s": 0.1, "rss_bytes": 1 << 26},
            "instance_type": "trn1.32xlarge",
            "cores": {"2": {"generation": 2, "device": 1, "busy_ns": 2_000_000_000, "flops": 10**12,
                            "executions": 10, "hbm_bytes": 10**9,
                            "engine_busy_ns": {"Tensor": 1e9, "DMA": 5e8}, "last_execution_at": now}},
            "models": [{"model_id": 1, "name": "bert", "uuid": "0" * 32, "core": 2, "device": 1, "rank": 0,
                        "loaded_at": now - 5, "executions": 10, "last_execution_at": now,
                        "memory": {"constants": 3 << 20, "model_code": 1 << 16,
                                   "model_shared_scratchpad": 1 << 20, "runtime_memory": 0,
                                   "tensors": 1 << 20}}],
            "execution_status": {"completed": 10}, "errors": {}, "total_latency_hist": {},
            "device_latency_hist": {}, "link_bytes": {}}


def test_once_live_state(tmp_path):
    holder = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.05)
        (tmp_path / f"{holder.pid}.json").write_text(json.dumps(_state_doc(holder.pid, time.time())))
        result = neuron_top("--once", "--interval", "0.1", "--instance", "trn1.32xlarge", "--width", "100",
                            env={"NEURONSCOPE_LIVE_DIR": str(tmp_path)})
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "running on" in out and "(trn1.32xlarge, simulated)" in out
        assert "ND1  " in out and "[svc] serve.py" in out and "ND1 NC0" in out
        assert "Model Scratchpad" in out and "tester" in out
    finally:
        holder.kill()


def test_once_with_no_live_processes(tmp_path):
    result = neuron_top("--once", "--interval", "0.05", env={"NEURONSCOPE_LIVE_DIR": str(tmp_path / "none")})
    assert result.returncode == 0, result.stderr
    assert "(no Neuron activity)" in result.stdout and "no process is publishing" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments"),
    (["--interval", "0"], "--interval must be at least"),
    (["--interval", "soon"], "invalid float value"),
    (["--from-monitor", "/nonexistent/stream.jsonl"], "no such file"),
    (["--instance", "trn9.huge", "--once"], "unknown instance type"),
    (["--once", "--width", "10"], "--width must be at least 40"),
    (["--from-monitor", "x", "--instance", "trn1.32xlarge"], "--instance applies to live state"),
    ([], "stdout is not a terminal"),
])
def test_bad_command_lines(args, message):
    result = neuron_top(*args)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("neuron-top: ")


def test_live_state_directory_open_to_others_is_one_line_and_exit_2(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    os.chmod(live, 0o777)
    result = neuron_top("--once", "--interval", "0.05", env={"NEURONSCOPE_LIVE_DIR": str(live)})
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "has mode 0777, open to other users" in result.stderr
