"""Recording inside a program started by ``neuron-profile capture -- CMD``: the env-var handshake.

The wrapper sets, for its child (declared in ``neuronscope.settings``; docs/settings.md):

* ``NEURONSCOPE_PROFILE_DIR``: where device profiles go (``collectors.profile`` layout);
* ``NEURONSCOPE_PROFILE_NTH_EXEC``: profile only each model's nth execution per core (0: none);
* ``NEURONSCOPE_EVENTS_FILE``: where the child writes its runtime API events (JSON lines) at exit,
  for the wrapper to fold into the system profile (a hidden file inside that profile's folder);
* ``NEURONSCOPE_CAPTURE_STATUS``: where the child reports recording errors at exit (JSON);
* ``NEURONSCOPE_ROW_GROUP_ROWS`` (optional, the user's to set): rows per committed part file
  (default 131,072). A killed program loses at most the rows not yet committed; smaller parts lose
  less and cost more files;
* ``NEURONSCOPE_WRAPPER_FD``: the read end of a pipe whose write end only the wrapper holds: when
  the wrapper dies (even by SIGKILL) the read returns end-of-file and the child stops itself as if
  sent SIGTERM, so its profiles are closed, marked incomplete.

This module is advertised under the ``neuronscope.sink_listeners`` entry points, so the execution
core attaches it to its event sink the first time the child makes an ``Instance``, without any
change to the child's code. With none of the variables set it does nothing.

Signals: SIGINT raises ``KeyboardInterrupt`` as always; SIGTERM, if the program has not set its own
handler, raises ``SystemExit(143)`` so the exit-time close runs (Python's default would end the
process without it). While the profiles are being closed at exit, further SIGINT/SIGTERM/SIGHUP are
ignored: a second Ctrl-C must not cut a profile in half.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import threading
from typing import Any

from neuronscope import settings

EVENTS_NAME = ".runtime-events.jsonl"
SIGTERM_EXIT = 128 + signal.SIGTERM


def install(sink: Any) -> None:
    """Attach the recorders the environment asks for to ``sink``; they finish at interpreter exit."""
    from collectors.device_profile import DeviceProfileCollector, RecordingError
    from collectors.system import RuntimeEventLog
    from formats.writer import DEFAULT_ROW_GROUP_ROWS

    out_dir = settings.PROFILE_DIR.get()
    events_file = settings.EVENTS_FILE.get()
    if out_dir is None and events_file is None:
        return
    collector = None
    if out_dir is not None:
        try:
            row_group_rows = settings.ROW_GROUP_ROWS.get() or DEFAULT_ROW_GROUP_ROWS
        except settings.SettingError:  # the user's optional tuning: a bad value keeps the default
            row_group_rows = DEFAULT_ROW_GROUP_ROWS
        collector = DeviceProfileCollector(out_dir, nth_exec=settings.PROFILE_NTH_EXEC.get(),
                                           row_group_rows=row_group_rows)
        sink.subscribe(collector)
    log = None
    if events_file is not None:
        log = RuntimeEventLog(os.uname().nodename)
        sink.subscribe(log)

    def finish() -> None:
        _shield_signals()
        if log is not None and events_file is not None:
            with contextlib.suppress(OSError):
                log.write_jsonl(events_file)
        if collector is None:
            return
        try:
            stopped = _stop_reason or _uncaught()
            if stopped:  # a profile whose execution had not finished is kept, marked incomplete
                collector.abort(stopped)
            collector.close()
        except RecordingError as exc:  # what was recorded is kept, marked; say why, once
            _report(str(exc))
        except Exception as exc:
            _report(f"device profile failed: {type(exc).__name__}: {exc}")

    atexit.register(finish)
    _stop_on_sigterm()
    _watch_wrapper()


_stop_reason: str | None = None  # why this program is being stopped, when we stop it


def _uncaught() -> str | None:
    """The exception the program is dying of, if any (the interpreter keeps it in ``sys.last_value``
    once it printed the traceback, before the exit-time functions run)."""
    exc = getattr(sys, "last_value", None)
    if exc is None or isinstance(exc, SystemExit):
        return None
    return f"the program stopped on {type(exc).__name__}"


def _report(message: str) -> None:
    status = settings.CAPTURE_STATUS.get()
    if status is not None:
        with contextlib.suppress(OSError), open(status, "w", encoding="utf-8") as out:
            json.dump({"errors": [message]}, out)
    if not settings.WRAPPER_FD.is_set():  # the wrapper prints it itself
        print(f"neuronscope: {message}", file=sys.stderr)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _shield_signals() -> None:
    if not _on_main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN)


def _sigterm(_signum: int, _frame: Any) -> None:
    global _stop_reason
    _stop_reason = _stop_reason or "the program was stopped by SIGTERM"
    raise SystemExit(SIGTERM_EXIT)


def _stop_on_sigterm() -> None:
    """SIGTERM stops the program like SIGINT does, through the exit-time close (unless the program
    handles SIGTERM itself: then its handler stays)."""
    if not _on_main_thread():
        return
    with contextlib.suppress(OSError, ValueError):
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _sigterm)


def _watch_wrapper() -> None:
    """Stop this program (SIGTERM to itself) when the wrapping ``neuron-profile capture`` dies."""
    try:
        fd = settings.WRAPPER_FD.get()
    except settings.SettingError:
        return
    if fd is None:
        return

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            return  # not our pipe (closed or never passed): nothing to watch
        global _stop_reason
        _stop_reason = "the wrapping neuron-profile capture died; the program was stopped"
        os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(OSError):
        os.fstat(fd)
        threading.Thread(target=watch, name="neuronscope-wrapper-watch", daemon=True).start()


__all__ = ["EVENTS_NAME", "install"]
