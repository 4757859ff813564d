"""Where live state lives, how a publisher's file is named, and whether its process is still the same.

One directory per user, shared by every publisher and reader on the host and kept in memory-backed
storage so frequent rewrites never touch a disk:

* ``$NEURONSCOPE_LIVE_DIR`` when set (tests, containers sharing a volume);
* else ``$XDG_RUNTIME_DIR/neuronscope`` (per-user tmpfs on systemd hosts);
* else ``/dev/shm/neuronscope-<uid>``;
* else ``<tempdir>/neuronscope-<uid>``.

Each publishing process owns one file, ``<pid>.json``. A pid alone does not identify a process (pids
are reused), so every file also records its process's start time, and readers compare it with the
start time of the process that has the pid now.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil

LIVE_DIR_ENV = "NEURONSCOPE_LIVE_DIR"
SUFFIX = ".json"
START_TIME_TOLERANCE_S = 1.0  # start times come from /proc in clock ticks; allow for rounding


def live_dir() -> Path:
    """The live-state directory for this user (not created here)."""
    explicit = os.environ.get(LIVE_DIR_ENV)
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return Path(runtime) / "neuronscope"
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path("/dev/shm") / f"neuronscope-{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"neuronscope-{os.getuid()}"


def ensure_live_dir(path: Path | None = None) -> Path:
    """Create the directory, private to the user (state files name commands and models)."""
    path = path or live_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def state_file(directory: Path, pid: int) -> Path:
    return directory / f"{pid}{SUFFIX}"


def pid_of(path: Path) -> int | None:
    """The pid a state file belongs to, from its name; None for anything else in the directory."""
    if path.suffix != SUFFIX or path.name.startswith("."):
        return None
    stem = path.stem
    return int(stem) if stem.isdigit() else None


def process_start_time(pid: int) -> float | None:
    """Start time (Unix seconds) of the process that has ``pid`` now; None if there is none."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return -1.0  # exists, owned by someone else: cannot check reuse, treat as alive


def same_process_alive(pid: int, start_time: float) -> bool:
    """True while the process that wrote a state file still runs (a reused pid does not count)."""
    now = process_start_time(pid)
    if now is None:
        return False
    if now < 0:
        return True
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    return abs(now - start_time) <= START_TIME_TOLERANCE_S


__all__ = ["LIVE_DIR_ENV", "ensure_live_dir", "live_dir", "pid_of", "process_start_time",
           "same_process_alive", "state_file"]
