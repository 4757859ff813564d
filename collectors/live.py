"""Live state: every process that runs compiled models publishes what its cores are doing.

No daemon: each process writes its own file in the live directory (``collectors.livepaths``) from a
background thread, every ``NEURONSCOPE_LIVE_PERIOD`` seconds (default 0.5), by writing a temporary
file (random name, 0600, ``O_EXCL|O_NOFOLLOW``) and renaming it over the old one, in a directory that
must be the user's own and private (``collectors.livepaths``; otherwise publishing is off, said once).
A rename is atomic, so a reader sees the previous file or the
new one, never half of one, and never waits for a writer (there are no locks to wait on). Readers
(``collectors.livereader``) drop files whose process has died.

When publishing starts (one place: :meth:`_ProcessLive.attach`). The execution core hands every
event sink to :func:`install` through the ``neuronscope.sink_listeners`` entry point when an
``Instance`` is made, so any program publishes without importing this module. What ``install`` does
depends on ``NEURONSCOPE_LIVE`` (``neuronscope.settings.LIVE``):

* ``auto`` (the default): nothing but register a probe on the sink (``EventSink.add_probe``). The
  core runs it from an execution at most once a second; it lists the live directory for watcher
  files (``collectors.livedemand``: neuron-top, neuron-monitor) and, once it finds one, attaches.
  Until then the sink has no listener, the core builds no records, and there is no thread, hook or
  file. Once attached, the process publishes until it exits.
* ``1``: attach at once (tests, and hosts where ``neuron-ls`` should always list the process).
* ``0``: nothing.

Attaching subscribes the process's one accumulator to the sink and registers the exit and fork
hooks; the publisher thread starts with the first record, and the file is removed at normal exit.

File contents (JSON, ``"format": "neuronscope-live"``, ``"version": 1``): the process (pid, start
time, tag from ``NEURON_PROCESS_TAG`` or the pid, command line, user, runtime version), the sample
time and sequence number, host CPU times and RSS, then the cumulative counters of
``collectors.livestate.LiveAccumulator``. See docs/live-and-monitor.md.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import psutil

from collectors import livedemand, livepaths
from collectors.livereader import ProcessState, read_live_state
from collectors.livestate import LiveAccumulator
from neuronscope import settings
from neuronscope.settings import LiveMode

DEFAULT_PERIOD_S = settings.LIVE_PERIOD.default
FORMAT = "neuronscope-live"
VERSION = 1

_log = logging.getLogger(__name__)


def mode() -> LiveMode:
    """``NEURONSCOPE_LIVE``; a value that does not parse warns and counts as the default (this runs
    inside someone else's program, which must not fail over a monitoring setting)."""
    try:
        return settings.LIVE.get()
    except settings.SettingError as exc:
        _log.warning("%s; using %s", exc, settings.LIVE.default.value)
        return settings.LIVE.default


def enabled() -> bool:
    """Whether this process may publish at all (always, or while watched)."""
    return mode() is not LiveMode.OFF


def publish_period() -> float:
    """The publishing period from the environment; a bad value falls back to the default."""
    try:
        value = settings.LIVE_PERIOD.get()
    except settings.SettingError as exc:
        _log.warning("%s; using %s", exc, DEFAULT_PERIOD_S)
        return DEFAULT_PERIOD_S
    return min(max(value, 0.02), 60.0)


def process_tag() -> str:
    """``NEURON_PROCESS_TAG`` (at most 255 characters, as the real runtime), else the pid."""
    tag = settings.PROCESS_TAG.get()
    return tag[:255] if tag else str(os.getpid())


def _runtime_version() -> str:
    try:
        from importlib.metadata import version

        return version("neuronscope")
    except Exception:
        return "0.0.0"


class Publisher:
    """Writes one process's live-state file at a fixed period from a daemon thread."""

    def __init__(self, accumulator: LiveAccumulator, directory: Path | None = None,
                 period_s: float | None = None) -> None:
        self.accumulator = accumulator
        self.directory = directory or livepaths.live_dir()
        self.period_s = period_s or publish_period()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sequence = 0
        self._identity: dict[str, Any] | None = None
        self._failed = False
        self.pid = os.getpid()

    @property
    def path(self) -> Path:
        return livepaths.state_file(self.directory, self.pid)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="neuronscope-live", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.publish_once()
            self._stop.wait(self.period_s)

    def identity(self) -> dict[str, Any]:
        """Facts about this process that do not change while it runs."""
        if self._identity is None:
            me = psutil.Process(self.pid)
            try:
                command = " ".join(me.cmdline()) or me.name()
            except psutil.Error:
                command = " ".join(sys.argv)
            try:
                user = me.username()
            except (psutil.Error, KeyError):
                user = str(os.getuid())
            self._identity = {
                "format": FORMAT, "version": VERSION, "pid": self.pid,
                "start_time": me.create_time(), "tag": process_tag(), "command": command,
                "user": user, "runtime_version": _runtime_version(), "period_s": self.period_s,
                "started_at": time.time(),
            }
        return self._identity

    def document(self) -> dict[str, Any]:
        """The state file's contents now."""
        self._sequence += 1
        times = os.times()
        try:
            rss = psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            rss = 0
        return {
            **self.identity(),
            "sequence": self._sequence,
            "sampled_at": time.time(),
            "host": {"cpu_user_s": times.user, "cpu_system_s": times.system, "rss_bytes": rss},
            **self.accumulator.snapshot(),
        }

    def publish_once(self) -> bool:
        """Write the file now; False (and publishing off) if the directory is unusable."""
        if self._failed:
            return False
        try:
            livepaths.ensure_live_dir(self.directory)
            data = json.dumps(self.document(), separators=(",", ":")).encode()
            livepaths.write_private(self.directory, self.path.name, data)  # 0600, O_EXCL|O_NOFOLLOW
            return True
        except livepaths.LiveDirError as exc:  # someone else's or an open directory: one line, then off
            self._failed = True
            _log.warning("live state disabled: %s", exc)
            return False
        except Exception as exc:  # never raise into the program being observed
            self._failed = True
            _log.warning("live state disabled: cannot write %s: %s", self.path, exc)
            return False

    def stop(self, remove: bool = True) -> None:
        """Stop the thread; remove the file (a normal exit leaves nothing behind)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if remove:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                _log.debug("cannot remove %s: %s", self.path, exc)


class _ProcessLive:
    """The one accumulator and publisher of this process, started by the first record after
    :meth:`attach`."""

    def __init__(self) -> None:
        self.accumulator = LiveAccumulator()
        self.publisher: Publisher | None = None
        self.sinks: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def __call__(self, batch: Any) -> None:
        self.accumulator(batch)
        if self.publisher is None:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self.publisher is None:
                publisher = Publisher(self.accumulator)
                publisher.start()
                self.publisher = publisher

    def attach(self, sink: Any) -> None:
        """Feed ``sink``'s batches to this process's live state: the one place publishing starts."""
        with self._lock:
            if sink in self.sinks:
                return
            self.sinks.add(sink)
        sink.subscribe(self)

    def shutdown(self) -> None:
        if self.publisher is not None and self.publisher.pid == os.getpid():
            self.publisher.stop(remove=True)

    def after_fork_in_child(self) -> None:
        """A forked child is another process: it starts from nothing and publishes its own file."""
        self.accumulator = LiveAccumulator()
        self.publisher = None
        self._lock = threading.Lock()


_process: _ProcessLive | None = None
_install_lock = threading.Lock()
_probed: weakref.WeakSet[Any] = weakref.WeakSet()  # sinks that already have a DemandProbe


def _process_live() -> _ProcessLive:
    """This process's live state, made (with its exit and fork hooks) the first time it is needed."""
    global _process
    with _install_lock:
        if _process is None:
            _process = _ProcessLive()
            atexit.register(_process.shutdown)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_process.after_fork_in_child)
        return _process


class DemandProbe:
    """Run by the core from an execution (``EventSink.poll``, at most once a second) while nobody
    watches: attaches live state to the sink as soon as a watcher's file appears."""

    def __init__(self, sink: Any, directory: Path | None = None) -> None:
        self.sink = sink
        self.directory = directory or livepaths.live_dir()

    def __call__(self) -> None:
        if livedemand.watched(self.directory):
            self.sink.remove_probe(self)
            _process_live().attach(self.sink)


def install(sink: Any) -> None:
    """Entry point for the core's listener hook: publish this process's live state from ``sink``,
    now (``NEURONSCOPE_LIVE=1``) or once someone watches (the default); see the module docstring.

    Several sinks may be given (one per private sink an ``Instance`` uses); they feed one state."""
    wanted = mode()
    if wanted is LiveMode.ON:
        _process_live().attach(sink)
    elif wanted is LiveMode.AUTO:
        with _install_lock:
            if sink in _probed:
                return
            _probed.add(sink)
        sink.add_probe(DemandProbe(sink))


__all__ = ["DEFAULT_PERIOD_S", "FORMAT", "VERSION", "DemandProbe", "ProcessState", "Publisher", "enabled",
           "install", "mode", "process_tag", "publish_period", "read_live_state"]
