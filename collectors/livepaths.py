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

Trust (issue 14): the directory must be a real directory (not a symlink), owned by the user and
private (no group or other permission bits); ``check_live_dir`` says otherwise in one line and
nothing is written to or read from such a directory (someone else could have created
``/dev/shm/neuronscope-<uid>`` first, to read command lines or plant state). Publishers create it
0700 and write each file 0600 under a random temporary name with ``O_CREAT|O_EXCL|O_NOFOLLOW``
relative to the directory's own descriptor, then rename it into place, so no link planted at a
guessable name can redirect a write.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

import psutil

from neuronscope import settings

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

SUFFIX = ".json"
START_TIME_TOLERANCE_S = 1.0  # start times come from /proc in clock ticks; allow for rounding


def live_dir() -> Path:
    """The live-state directory for this user (not created here)."""
    explicit = settings.LIVE_DIR.get()
    if explicit is not None:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return Path(runtime) / "neuronscope"
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path("/dev/shm") / f"neuronscope-{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"neuronscope-{os.getuid()}"


class LiveDirError(OSError):
    """The live-state directory cannot be trusted or used; the message is the one line to show."""


def _check_stat(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise LiveDirError(f"live-state directory {path} is a symbolic link; refusing to use it")
    if not stat.S_ISDIR(info.st_mode):
        raise LiveDirError(f"live-state directory {path} is not a directory; refusing to use it")
    if info.st_uid != os.getuid():
        raise LiveDirError(f"live-state directory {path} is owned by uid {info.st_uid}, not you "
                           f"(uid {os.getuid()}); refusing to use it (remove it, or set "
                           f"{settings.LIVE_DIR.name})")
    if info.st_mode & 0o077:
        raise LiveDirError(f"live-state directory {path} has mode {stat.S_IMODE(info.st_mode):04o}, "
                           f"open to other users; refusing to use it (chmod 700 {path})")


def check_live_dir(path: Path | None = None) -> bool:
    """False if the directory does not exist; True if it is ours and private; LiveDirError if not."""
    path = path or live_dir()
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise LiveDirError(f"live-state directory {path}: {exc.strerror or exc}") from None
    _check_stat(path, info)
    return True


def ensure_live_dir(path: Path | None = None) -> Path:
    """Create the directory private to the user (state files name commands and models), or check
    that an existing one is; LiveDirError if it is someone else's or open to others."""
    path = path or live_dir()
    if not check_live_dir(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another publisher just made it: checked below
            os.mkdir(path, 0o700)
        check_live_dir(path)
    return path


def open_live_dir(path: Path) -> int:
    """A descriptor of the (checked) directory, opened without following a link, checked again
    through the descriptor so a swap between the check and the open is caught."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise LiveDirError(f"live-state directory {path}: {exc.strerror or exc}") from None
    try:
        _check_stat(path, os.fstat(fd))
    except LiveDirError:
        os.close(fd)
        raise
    return fd


def write_private(directory: Path, name: str, data: bytes) -> None:
    """Write ``directory/name`` atomically: a random temporary name created exclusively (0600, never
    through a link), then renamed over ``name``. Readers see the old file or the new one."""
    fd_dir = open_live_dir(directory)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
        for _ in range(8):
            tmp = f".{os.getpid()}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=fd_dir)
                break
            except FileExistsError:
                continue  # something is at that name (a planted link?): never write through it
        else:
            raise LiveDirError(f"cannot create a temporary file in {directory}")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, name, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd_dir)
            raise
    finally:
        os.close(fd_dir)


def read_private(directory_fd: int, name: str, limit: int) -> bytes | None:
    """A state file's bytes read through the directory's descriptor, or None if it is not a regular
    file we own (a link, a FIFO: never followed, never waited on) or is over ``limit`` bytes."""
    flags = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW
    fd = os.open(name, flags, dir_fd=directory_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > limit:
            return None
        return os.read(fd, limit + 1)[:limit + 1]
    finally:
        os.close(fd)


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


__all__ = ["LiveDirError", "check_live_dir", "ensure_live_dir", "live_dir",
           "open_live_dir", "pid_of", "process_start_time", "read_private", "same_process_alive",
           "state_file", "write_private"]
