"""neuron-top's own cost, watching 32 busy cores of 4 publishing processes; prints one JSON line.

    python bench/tui.py [--seconds 60]

* ``top_cpu_percent``: CPU time of the neuron-top process (user + system, all its threads; % of one
  core), measured by psutil from outside while it refreshes at 2 Hz (``--interval 0.5``) in a
  160x50 pseudo-terminal on a simulated trn1.32xlarge. The median of 5-second windows over
  ``--seconds`` (default 60), start-up excluded; ``top_cpu_percent_mean`` is the whole-run figure.
  Target <= 3.
* ``top_first_frame_s``: from starting ``neuron-top`` to the first frame with data on the terminal
  (the utilisation header with its average), interpreter start-up and imports included; median of
  3 starts. Target <= 1.

Publishers: 4 ``neuron-profile run`` load generators (bert-layer, 8 replicas each on cores 0-7,
8-15, 16-23, 24-31) publishing live state every 0.5 s into a private live directory, paced to a low
device utilisation so the 4 of them leave this host's CPUs usable. When ``bench/tui_view.py`` (the
profile viewer's benchmark) exists, its ``measure_view()`` figures are merged into the line.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import pty
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
COLUMNS, ROWS = 160, 50
FIRST_FRAME_MARK = b"Utilization (Avg:"
WINDOW_S = 5.0


class TopInTerminal:
    """neuron-top in a pseudo-terminal of a fixed size, its output drained (and searched) by a thread."""

    def __init__(self, env: dict[str, str], interval: float) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "explorer.top", "--interval", str(interval),
             "--instance", "trn1.32xlarge"],
            stdin=slave, stdout=slave, stderr=slave, env={**env, "TERM": "xterm-256color"}, cwd=REPO,
            start_new_session=True)
        os.close(slave)
        self.master = master
        self.first_frame_at: float | None = None
        self._seen = b""
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            if self.first_frame_at is None:
                self._seen = (self._seen + chunk)[-4096:]
                if FIRST_FRAME_MARK in self._seen:
                    self.first_frame_at = time.monotonic()

    def wait_first_frame(self, timeout: float = 30.0) -> float:
        deadline = time.monotonic() + timeout
        while self.first_frame_at is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("neuron-top showed no frame")
            time.sleep(0.005)
        return self.first_frame_at - self.started

    def stop(self) -> None:
        try:
            os.write(self.master, b"q")
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        os.close(self.master)


def start_publishers(live_dir: Path, env: dict[str, str], seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen(
        [sys.executable, "-c", "from explorer.profile_cli import main; raise SystemExit(main())", "run",
         "--workload", "bert-layer", "--instance", "trn1.32xlarge", "--replicas", "8", "--core", str(8 * i),
         "--duration", str(seconds), "--utilisation", "0.005"],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(4)]


def measure_cpu(top: TopInTerminal, seconds: float) -> tuple[float, float]:
    """(median of 5 s windows, whole-run mean), % of one core."""
    me = psutil.Process(top.proc.pid)
    windows = []
    start_cpu, start = sum(me.cpu_times()[:2]), time.monotonic()
    cpu, at = start_cpu, start
    while time.monotonic() - start < seconds:
        time.sleep(min(WINDOW_S, seconds - (time.monotonic() - start)) or 0.01)
        now_cpu, now = sum(me.cpu_times()[:2]), time.monotonic()
        windows.append(100.0 * (now_cpu - cpu) / (now - at))
        cpu, at = now_cpu, now
    return statistics.median(windows), 100.0 * (cpu - start_cpu) / (at - start)


def view_figures() -> dict[str, float]:
    """The profile viewer's figures, if its benchmark exists (built alongside, in bench/tui_view.py)."""
    path = Path(__file__).with_name("tui_view.py")
    if not path.exists():
        return {}
    spec = importlib.util.spec_from_file_location("tui_view", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return dict(module.measure_view())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="CPU measurement time (default 60)")
    parser.add_argument("--starts", type=int, default=3, help="starts timed for the first frame (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        live_dir = Path(tmp) / "live"
        env = dict(os.environ, NEURONSCOPE_LIVE="1", NEURONSCOPE_LIVE_DIR=str(live_dir),
                   PYTHONPATH=str(REPO), NEURONSCOPE_IMDS="0")
        publishers = start_publishers(live_dir, env, args.seconds + 30 * args.starts + 60)
        top_env = {**env, "NEURONSCOPE_LIVE": "0"}
        try:
            deadline = time.monotonic() + 120
            while len(list(live_dir.glob("*.json"))) < 4:
                if time.monotonic() > deadline:
                    raise SystemExit("publishers did not start")
                time.sleep(0.1)
            time.sleep(2.0)  # let them settle into their loops
            first_frames = []
            for _ in range(args.starts):
                top = TopInTerminal(top_env, 0.5)
                first_frames.append(top.wait_first_frame())
                top.stop()
            top = TopInTerminal(top_env, 0.5)
            top.wait_first_frame()
            time.sleep(2.0)  # start-up work (imports, first layout) is not the steady cost
            cpu_median, cpu_mean = measure_cpu(top, args.seconds)
            top.stop()
        finally:
            for p in publishers:
                p.terminate()
            for p in publishers:
                p.wait(timeout=30)
    line = {"top_cpu_percent": round(cpu_median, 2), "top_cpu_percent_mean": round(cpu_mean, 2),
            "top_cpu_target": 3.0, "top_first_frame_s": round(statistics.median(first_frames), 3),
            "top_first_frame_target_s": 1.0, "interval_s": 0.5, "terminal": f"{COLUMNS}x{ROWS}",
            "publishers": 4, "cores": 32, "seconds": args.seconds}
    line.update(view_figures())
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
