"""neuron-monitor's own cost with 32 cores in use by 4 publishing processes; prints one JSON line.

    python bench/monitor.py [--seconds 10]

* ``monitor_cpu_percent``: CPU time of neuron-monitor (user + system, % of one core) at period 1 s,
  every group configured, measured from its first report on (start-up excluded). Target <= 2.
* ``reports_per_s``: reports written per second at period 0.1 s (ideal: 10).

Publishers: 4 processes on a simulated trn1.32xlarge, each with a small model loaded on 8 cores and
executed round-robin (a short pause per round keeps the host usable), publishing live state every
0.5 s as by default. Everything runs on this host, so the figures include its noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
PUBLISHER = """
import os, sys, time
import neuroncore as nc
first, stop = int(sys.argv[1]), sys.argv[2]
b = nc.GraphBuilder("bench")
x = b.parameter("x", (128, 256), "bf16")
y = b.matmul(x, b.weight("w", (256, 256), "bf16"))
program = nc.compile(b.build([y]), "trn1")
instance = nc.Instance("trn1.32xlarge")
models = [instance.core(c).load(program) for c in range(first, first + 8)]
while not os.path.exists(stop):
    for m in models:
        m.execute(timing_only=True)
    time.sleep(0.02)
"""
GROUPS = {"period": "{period}", "neuron_runtimes": [{"metrics": [
    {"type": "neuroncore_counters"}, {"type": "execution_stats"}, {"type": "memory_used"},
    {"type": "neuron_runtime_vcpu_usage"}]}],
    "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}, {"type": "neuron_hw_counters"}]}


def run_monitor(live_dir: Path, period: str, seconds: float, env: dict[str, str]) -> tuple[float, float]:
    """(CPU % of one core after the first report, reports per second) for one monitor run."""
    conf = live_dir.parent / f"monitor-{period}.json"
    conf.write_text(json.dumps(GROUPS).replace("{period}", period))
    proc = subprocess.Popen([sys.executable, "-m", "collectors.monitor", "-c", str(conf), "--instance",
                             "trn1.32xlarge"], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    me = psutil.Process(proc.pid)
    proc.stdout.readline()  # first report: start-up is over
    cpu0, t0, count = sum(me.cpu_times()[:2]), time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        line = proc.stdout.readline()
        if not line:
            break
        count += 1
    elapsed = time.monotonic() - t0
    cpu = sum(me.cpu_times()[:2]) - cpu0
    proc.terminate()
    proc.wait(timeout=10)
    return 100.0 * cpu / elapsed, count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement time per period")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        live_dir, stop = Path(tmp) / "live", Path(tmp) / "stop"
        env = dict(os.environ, NEURONSCOPE_LIVE="1", NEURONSCOPE_LIVE_DIR=str(live_dir),
                   PYTHONPATH=str(REPO))
        publishers = [subprocess.Popen([sys.executable, "-c", PUBLISHER, str(8 * i), str(stop)], env=env,
                                       cwd=REPO) for i in range(4)]
        try:
            deadline = time.monotonic() + 60
            while len(list(live_dir.glob("*.json"))) < 4:
                if time.monotonic() > deadline:
                    raise SystemExit("publishers did not start")
                time.sleep(0.1)
            cpu_percent, _ = run_monitor(live_dir, "1s", args.seconds, env)
            _, reports_per_s = run_monitor(live_dir, "100ms", min(args.seconds, 5.0), env)
        finally:
            stop.write_text("")
            for p in publishers:
                p.wait(timeout=30)
    print(json.dumps({"monitor_cpu_percent": round(cpu_percent, 3), "monitor_cpu_target": 2.0,
                      "reports_per_s": round(reports_per_s, 2), "reports_per_s_ideal": 10.0,
                      "publishers": 4, "cores": 32, "seconds": args.seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
