"""Who is watching: the demand side of live state.

A process that runs models publishes its live state only when something asks (``NEURONSCOPE_LIVE``
unset or ``auto``, the default): a watcher -- ``neuron-top`` on live state, ``neuron-monitor``,
``neuron-monitor-prometheus`` -- holds a :class:`Watch` while it runs, a file ``<pid>.watch`` in the
live-state directory. A model-running process checks for such a file at most once a second, from
its own executions (``EventSink.poll``: no thread, no timer), and starts publishing when it finds
one (``collectors.live``). Nobody watching: no listener on the sink, no records built, no thread,
no file.

Watch files are empty-ish JSON (``{"pid": ..}``), written like state files (0600, atomic rename,
never through a link) in the same private directory; readers of state files skip them (their suffix
is not ``.json``). A watcher killed without cleanup leaves a file whose pid is gone: it no longer
counts, and the next watcher removes it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
from pathlib import Path
from types import TracebackType

import psutil

from collectors import livepaths

SUFFIX = ".watch"


def watch_file(directory: Path, pid: int) -> Path:
    return directory / f"{pid}{SUFFIX}"


def _watcher_pids(directory: Path) -> list[int]:
    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
    except OSError:  # no directory yet (nobody ever watched), or not readable
        return []
    return [int(name[:-len(SUFFIX)]) for name in names
            if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit()]


def watched(directory: Path) -> bool:
    """True while some live watcher (other than a dead one) has its file in ``directory``.

    Cheap enough to ask once a second from a program being observed: one directory listing and a
    signal-0 check per watcher file; nothing is created, read or removed."""
    return any(psutil.pid_exists(pid) for pid in _watcher_pids(directory))


class Watch:
    """This process's "I am watching" file, for as long as it runs (or until :meth:`stop`)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or livepaths.live_dir()
        self.pid = os.getpid()
        self.active = False

    @property
    def path(self) -> Path:
        return watch_file(self.directory, self.pid)

    def start(self) -> bool:
        """Announce the watch; False if the directory cannot be used (readers report that)."""
        if self.active:
            return True
        try:
            livepaths.ensure_live_dir(self.directory)
            for pid in _watcher_pids(self.directory):  # watchers that died without cleaning up
                if pid != self.pid and not psutil.pid_exists(pid):
                    with contextlib.suppress(OSError):
                        watch_file(self.directory, pid).unlink()
            livepaths.write_private(self.directory, self.path.name, json.dumps({"pid": self.pid}).encode())
        except OSError:  # LiveDirError included: the live reader says why, once
            return False
        self.active = True
        atexit.register(self.stop)
        return True

    def stop(self) -> None:
        if not self.active or self.pid != os.getpid():  # a forked child does not own the file
            return
        self.active = False
        with contextlib.suppress(OSError):
            self.path.unlink()

    def __enter__(self) -> Watch:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["SUFFIX", "Watch", "watch_file", "watched"]
