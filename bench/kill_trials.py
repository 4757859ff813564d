"""Kill trials of a wrapped capture: prints ONE JSON line.

    python bench/kill_trials.py                 # 50 trials (a few minutes on a loaded 2-core machine)
    python bench/kill_trials.py --trials 5 --seed 3

Each trial runs ``neuron-profile capture --profile-nth-exec 1 -- python WORKLOAD`` (the workload
compiles and runs four Llama decode programs of 1..4 layers, timing only, each recorded into its own
device profile, with parts committed every ``ROW_GROUP_ROWS`` rows) and, at a random moment, sends
SIGKILL, SIGINT or SIGTERM to the wrapped program, to the wrapper, or to the whole process group (a
terminal's Ctrl-C). It waits for both processes to end, then checks what is on disk:

* ``flushed_rows_lost``: rows of parts the writer reported committed (``NEURONSCOPE_COMMIT_LOG``)
  that are not readable, with that row count, in the profile's final folder (``<dir>`` or
  ``<dir>.incomplete``);
* ``unreadable_profiles``: profile folders of which a table fails to read whole;
* ``unmarked_profiles``: folders holding tables that a reader would take for whole captures while
  they are not: hidden staging folders, ``<dir>`` without ``Metadata.capture_complete = true``,
  ``<dir>.incomplete`` without ``capture_complete = false``;
* ``stray_files``: hidden files left in the output outside an incomplete profile. Inside one, a
  SIGKILL may leave the part being written (``.<Table>_N.parquet.tmp``, the uncommitted tail) or,
  when the wrapper was killed, the runtime event log (``.runtime-events.jsonl``): readers skip them;
* ``hung``: trials where a process outlived the signal by more than ``WAIT_S`` (then killed).

Target: 0 lost, 0 unreadable, 0 unmarked. The ``collectors`` tests import ``run_trial`` for a few
representative cases.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]

from formats.reader import open_profile  # noqa: E402
from formats.schema import table_of_file  # noqa: E402

ROW_GROUP_ROWS = 128
WAIT_S = 90.0
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
TARGETS = ("child", "wrapper", "group")
WORKLOAD = """\
import neuroncore as nc
from neuroncore.workloads import get

instance = nc.Instance("trn1.2xlarge")
print("started", flush=True)
for layers in range(1, 5):
    program = nc.compile(get("llama-decode").graph(layers=layers), "trn1")
    instance.core(0).load(program).execute(timing_only=True)
print("finished", flush=True)
"""


@dataclass
class TrialResult:
    """What one trial left on disk."""

    signal: str
    target: str
    delay_s: float
    wrapper_exit: int | None
    committed_rows: int = 0
    flushed_rows_lost: int = 0
    profiles: int = 0
    unreadable: list[str] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)
    hung: bool = False


def _environment(commit_log: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "NEURONSCOPE_LIVE": "0",
            "NEURONSCOPE_COMMIT_LOG": str(commit_log), "NEURONSCOPE_ROW_GROUP_ROWS": str(ROW_GROUP_ROWS)}


def _wait_gone(pids: list[int], timeout: float) -> bool:
    """True if every pid ended within ``timeout`` (zombies of ours count as ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def run_trial(root: Path, sig: str, target: str, delay_s: float, workload: str = WORKLOAD, *,
              after_commits: int = 0) -> TrialResult:
    """One capture, one signal ``delay_s`` after it started (or, with ``after_commits``, once that many
    parts of device profiles were committed: the system profile's periodic flushes do not count, or a
    slow start would signal before any execution was recorded); then the disk is checked."""
    root.mkdir(parents=True, exist_ok=True)
    script, out, commit_log = root / "workload.py", root / "out", root / "commits.jsonl"
    script.write_text(workload)
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "explorer.profile_cli", "capture", "-o", str(out), "--profile-nth-exec", "1",
         "--system-interval", "0.05", "--", sys.executable, str(script)],
        cwd=REPO, env=_environment(commit_log), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: "group" is a terminal's Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = time.monotonic()
    children: list[int] = []
    def waiting() -> bool:
        elapsed = time.monotonic() - started
        if after_commits:
            return _commits(commit_log, under=out / "device") < after_commits and elapsed < WAIT_S
        return elapsed < delay_s

    while wrapper.poll() is None and waiting():
        time.sleep(0.02)
        with_children = _children(wrapper.pid)
        children = with_children or children
    result = TrialResult(sig, target, round(delay_s, 2), None)
    if wrapper.poll() is None:
        children = _children(wrapper.pid) or children
        number = SIGNALS[sig]
        try:
            if target == "wrapper":
                os.kill(wrapper.pid, number)
            elif target == "group":
                os.killpg(wrapper.pid, number)
            elif children:
                os.kill(children[0], number)
        except ProcessLookupError:
            pass
    try:
        result.wrapper_exit = wrapper.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        result.hung = True
        wrapper.kill()
        result.wrapper_exit = wrapper.wait()
    if not _wait_gone(children, WAIT_S):
        result.hung = True
        for pid in children:
            with _suppress():
                os.kill(pid, signal.SIGKILL)
        _wait_gone(children, 10)
    check(out, commit_log, result)
    return result


def _commits(commit_log: Path, *, under: Path) -> int:
    """Parts committed so far to profiles inside ``under``."""
    try:
        lines = commit_log.read_text().splitlines()
    except OSError:
        return 0
    inside = 0
    for line in lines:
        with _suppress():  # the line being appended may be read half-written
            inside += Path(json.loads(line)["profile"]).is_relative_to(under)
    return inside


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def _profile_dirs(out: Path) -> list[Path]:
    """Every folder under ``out`` holding ``<Table>.parquet`` files, hidden ones included."""
    if not out.exists():
        return []
    return sorted({p.parent for p in out.rglob("*.parquet") if table_of_file(p.name) is not None})


def _metadata_flag(path: Path) -> object:
    try:
        rows = pq.read_table(path / "Metadata.parquet").to_pylist()
    except Exception:
        return "missing"
    return rows[0].get("capture_complete") if rows else "missing"


def check(out: Path, commit_log: Path, result: TrialResult) -> None:
    """Fill ``result`` from what is on disk."""
    for path in _profile_dirs(out):
        result.profiles += 1
        name = str(path.relative_to(out))
        try:
            profile = open_profile(path)
            for table in profile.tables:
                for part in profile.files(table):
                    pq.read_table(part)
        except Exception as exc:
            result.unreadable.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
        flag = _metadata_flag(path)
        hidden = any(part.startswith(".") for part in path.relative_to(out).parts)
        incomplete_name = ".incomplete" in path.name
        if hidden or (incomplete_name and flag is not False) or (not incomplete_name and flag is not True):
            result.unmarked.append(f"{name} (capture_complete={flag})")
    if out.exists():  # hidden files inside an incomplete profile belong to it (see the module doc)
        result.stray = sorted(str(p.relative_to(out)) for p in out.rglob(".*")
                              if p.is_file() and ".incomplete" not in p.parent.name)
    if commit_log.exists():
        for line in commit_log.read_text().splitlines():
            entry = json.loads(line)
            result.committed_rows += entry["rows"]
            if not _part_kept(Path(entry["profile"]), entry["part"], entry["table"], entry["rows"]):
                result.flushed_rows_lost += entry["rows"]


def _part_kept(target: Path, part: str, table: str, rows: int) -> bool:
    """The committed part, with its rows, in the profile's final folder (a single part is renamed to
    plain ``<Table>.parquet`` when the profile closes)."""
    folders = [target, *sorted(target.parent.glob(target.name + ".incomplete*"))]
    names = [part] + ([f"{table}.parquet"] if part == f"{table}_0.parquet" else [])
    for folder in folders:
        for name in names:
            try:
                if pq.ParquetFile(folder / name).metadata.num_rows == rows:
                    return True
            except Exception:
                continue
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=8.0,
                        help="latest moment of the signal, in seconds after the capture started")
    parser.add_argument("--verbose", action="store_true", help="one line per trial on stderr")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    totals: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kill-trials-") as tmp:
        for i in range(args.trials):
            sig, target = rng.choice(sorted(SIGNALS)), rng.choice(TARGETS)
            result = run_trial(Path(tmp) / f"t{i}", sig, target, rng.uniform(0.3, args.max_delay))
            kinds[f"{sig}->{target}"] += 1
            totals["committed_rows"] += result.committed_rows
            totals["flushed_rows_lost"] += result.flushed_rows_lost
            totals["unreadable_profiles"] += len(result.unreadable)
            totals["unmarked_profiles"] += len(result.unmarked)
            totals["stray_files"] += len(result.stray)
            totals["profiles"] += result.profiles
            totals["hung"] += result.hung
            bad = result.unreadable or result.unmarked or result.flushed_rows_lost or result.hung
            if args.verbose or bad:
                print(json.dumps(asdict(result)), file=sys.stderr)
    print(json.dumps({
        "trials": args.trials, "flushed_rows_lost": totals["flushed_rows_lost"],
        "unreadable_profiles": totals["unreadable_profiles"],
        "unmarked_profiles": totals["unmarked_profiles"],
        "committed_rows": totals["committed_rows"], "profiles_checked": totals["profiles"],
        "stray_files": totals["stray_files"], "hung": totals["hung"], "signals": dict(sorted(kinds.items())),
        "wall_s": round(time.monotonic() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
