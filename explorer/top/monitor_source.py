"""Frames from a neuron-monitor stream: a file (followed as it grows) or a pipe (``-``).

Any producer's stream works, ours or a real host's (``ssh host neuron-monitor | neuron-top
--from-monitor -``). Bad input never stops the view (issue 7): a line that is not JSON, or JSON that
is not a report, is counted and named in the status line while the last good report stays up; the
end of a pipe is shown as such; a stream that goes quiet says for how long.

Groups are refreshed on their own periods (sys-tools.md §1.5), so the last object of each group is
kept per pid and per system group, and a report that leaves a group out does not blank it. A pid
missing from a report has exited. Each report is one history sample, so a recorded file replays its
whole history into the sparklines.

Bounded (issue 14): a line longer than ``reportvalues.MAX_LINE_CHARS`` is skipped without being held
in memory, JSON nested too deeply or with numbers Python refuses is a bad line like any other, and
each bad line is counted and named (``line N: what was wrong``). Values are checked in
``explorer.top.report``; at most ``MAX_LINES_PER_POLL`` lines are taken per poll so a fast producer
cannot starve the screen.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal, TextIO

from collectors.reportvalues import (
    MAX_LINE_CHARS,
    TOO_LONG,
    BadValue,
    loads,
    period,
    read_bounded_line,
    text,
)
from explorer.top.history import History
from explorer.top.report import (
    ReportError,
    check_report,
    hardware_problems,
    parse_hardware,
    parse_process,
    parse_system,
    pid_of,
    runtime_groups,
)
from explorer.top.snapshots import (
    EXITED,
    Frame,
    Hardware,
    ProcessSnapshot,
    SourceStatus,
    SystemSnapshot,
)

GONE_GRACE_S = 10.0
MAX_ERRORS = 5
QUIET_MIN_S = 15.0  # say "no new report" after max(3 periods, this)
MAX_LINES_PER_POLL = 4096
QUEUE_LINES = 256  # lines a pipe's reader thread may hold before it waits for the screen
_EOF = object()
_TOO_LONG = TOO_LONG


def _groups_of(value: Any) -> list[Any]:
    return list(value.values()) if isinstance(value, Mapping) else []


def _period(report: Mapping[str, Any]) -> float:
    """The longest group period in a report (how often to expect the next one)."""
    groups = []
    for entry in report.get("neuron_runtime_data") or []:
        if isinstance(entry, Mapping):
            groups += _groups_of(entry.get("report"))
    groups += _groups_of(report.get("system_data"))
    periods = [period(g.get("period")) for g in groups if isinstance(g, Mapping)]
    return max((p for p in periods if p is not None), default=5.0)


class MonitorSource:
    """Reads a neuron-monitor stream; ``poll()`` consumes what has arrived and returns a frame when
    anything changed (None otherwise, so an idle stream costs no redraw)."""

    kind: Literal["monitor"] = "monitor"

    def __init__(self, path: str, stream: TextIO | None = None, *, host_name: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.name = "stdin" if path == "-" else path
        self.clock = clock
        self.host_name = host_name
        self.history = History()
        self.hardware = Hardware("", "", "", 0, 0, 0)
        self.system = SystemSnapshot()
        self._groups: dict[int, dict[str, Any]] = {}
        self._first_seen: dict[int, float] = {}
        self._processes: dict[int, ProcessSnapshot] = {}
        self._gone: dict[int, ProcessSnapshot] = {}
        self._errors: deque[str] = deque(maxlen=MAX_ERRORS)
        self._line_no = 0
        self._reports = 0
        self._malformed = 0
        self._ended = False
        self._partial = ""
        self._dropping = False  # inside an over-long line of a followed file
        self._period = 5.0
        self._last_report_at: float | None = None
        self._sequence = 0
        self._last_message = ""
        self._file: TextIO | None = None
        self._queue: queue.Queue[Any] | None = None
        self._opened_at = clock()
        if stream is None:
            stream = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 -- closed in close()
        elif hasattr(stream, "reconfigure"):  # stdin: bytes that are not UTF-8 are a bad line, not the end
            with contextlib.suppress(ValueError, OSError, AttributeError):
                stream.reconfigure(errors="replace")
        if self._is_regular(stream):
            self._file = stream
        else:  # a pipe blocks at "no data yet": a daemon thread waits on it instead of the UI
            self._queue = queue.Queue(maxsize=QUEUE_LINES)
            threading.Thread(target=self._pump, args=(stream,), name="neuron-top-stream", daemon=True).start()

    @staticmethod
    def _is_regular(stream: TextIO) -> bool:
        try:
            return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
        except (OSError, ValueError, AttributeError):  # StringIO and the like: read like a file
            return isinstance(stream, io.StringIO) or not hasattr(stream, "fileno")

    def _pump(self, stream: TextIO) -> None:
        assert self._queue is not None
        try:
            while line := read_bounded_line(stream, MAX_LINE_CHARS):
                self._queue.put(line)
        except (OSError, ValueError) as exc:
            self._queue.put(f"\0read error: {text(exc, 120)}")
        self._queue.put(_EOF)

    # -- reading -------------------------------------------------------------------------------

    def _lines(self) -> list[str]:
        """Complete lines that have arrived since the last call."""
        lines: list[str] = []
        if self._file is not None:
            while len(lines) < MAX_LINES_PER_POLL:
                chunk = self._file.readline(MAX_LINE_CHARS + 1)
                if not chunk:
                    break
                if self._dropping:  # the rest of an over-long line
                    self._dropping = not chunk.endswith("\n")
                    continue
                if len(self._partial) + len(chunk) > MAX_LINE_CHARS + 1:
                    self._partial = ""
                    self._dropping = not chunk.endswith("\n")
                    lines.append(_TOO_LONG)
                    continue
                if not chunk.endswith("\n"):
                    self._partial += chunk  # a writer is mid-line: wait for the rest
                    continue
                lines.append(self._partial + chunk)
                self._partial = ""
            if self._partial.strip() and not self._dropping:
                try:  # a finished file without a final newline: its last line is complete
                    json.loads(self._partial)
                    lines.append(self._partial)
                    self._partial = ""
                except (ValueError, RecursionError):
                    pass
            return lines
        assert self._queue is not None
        while len(lines) < MAX_LINES_PER_POLL:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return lines
            if item is _EOF:
                self._ended = True
                return lines
            lines.append(item)
        return lines

    def _error(self, message: str) -> None:
        self._errors.append(text(message, 200))

    def _consume(self, line: str, now: float) -> bool:
        self._line_no += 1
        if line.startswith("\0read error"):
            self._error(line[1:].strip())
            return True
        if line == _TOO_LONG:
            self._malformed += 1
            self._error(f"line {self._line_no}: longer than {MAX_LINE_CHARS:,} characters, skipped")
            return True
        stripped = line.strip()
        if not stripped:
            return False
        try:
            report = check_report(loads(stripped))
        except BadValue as exc:
            self._malformed += 1
            self._error(f"line {self._line_no}: {exc}")
            return True
        except ReportError as exc:
            self._malformed += 1
            self._error(f"line {self._line_no}: not a report ({text(exc, 80)})")
            return True
        self._apply(report, now)
        return True

    def _apply(self, report: Mapping[str, Any], now: float) -> None:
        self.hardware = parse_hardware(report, self.hardware)
        system_data = report.get("system_data")
        self.system = parse_system(system_data, self.system)
        processes: dict[int, ProcessSnapshot] = {}
        groups: dict[int, dict[str, Any]] = {}
        problems = [f"neuron_hardware_info: {p}" for p in hardware_problems(report)]
        if isinstance(system_data, Mapping):  # this line's own problems, not ones kept from before
            problems += [e for e in self.system.errors if ": malformed" in e or ": not an object" in e]
        elif system_data is not None:
            problems.append("system_data is not an object")
        for entry in report.get("neuron_runtime_data") or []:
            if not isinstance(entry, Mapping):
                problems.append("an application entry is not an object")
                continue
            snap = parse_process(entry, self.hardware, self._groups.get(pid_of(entry)))
            problems += [f"pid {snap.pid} {group}: {why}" for group, why in snap.group_errors.items()
                         if why.startswith("malformed") and isinstance(entry.get("report"), Mapping)
                         and group in entry["report"]]
            if snap.pid < 0:
                problems.append(snap.error)
            groups[snap.pid] = runtime_groups(entry, self._groups.get(snap.pid))
            first = self._first_seen.setdefault(snap.pid, now)
            processes[snap.pid] = replace(snap, started_at=first, started_exact=False)
        for pid, last in self._processes.items():
            if pid not in processes:
                self._gone[pid] = replace(last, state=EXITED, gone_at=now, cores=None)
        self._first_seen = {pid: t for pid, t in self._first_seen.items() if pid in processes}
        self._groups = groups
        self._processes = processes
        self._reports += 1
        self._period = _period(report)
        self._last_report_at = now
        self.history.record(processes.values())
        if problems:  # the line was used, but not all of it: count it and say the first thing wrong
            self._malformed += 1
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            self._error(f"line {self._line_no}: {problems[0]}{more}")

    # -- frames --------------------------------------------------------------------------------

    def _message(self, now: float) -> str:
        if self._ended:
            if not self._reports:
                return f"{self.name} ended before any neuron-monitor report"
            return f"{self.name} ended after {self._reports} reports; showing the last one"
        if not self._reports:
            return f"waiting for the first neuron-monitor report on {self.name}"
        quiet = now - (self._last_report_at or now)
        if quiet > max(3 * self._period, QUIET_MIN_S):
            return f"no new report on {self.name} for {int(quiet)}s"
        return ""

    def poll(self) -> Frame | None:
        now = self.clock()
        changed = self._sequence == 0
        ended_before = self._ended
        for line in self._lines():
            changed |= self._consume(line, now)
        changed |= self._ended != ended_before
        self._gone = {pid: p for pid, p in self._gone.items()
                      if pid not in self._processes and now - (p.gone_at or now) <= GONE_GRACE_S}
        message = self._message(now)
        changed |= message != self._last_message
        self._last_message = message
        if not changed:
            return None
        self._sequence += 1
        status = SourceStatus("monitor", self.name, message=message, errors=tuple(self._errors),
                              ended=self._ended, reports=self._reports, malformed=self._malformed)
        ordered = tuple(sorted(self._processes.values(), key=lambda p: p.pid)) + tuple(
            sorted(self._gone.values(), key=lambda p: p.pid))
        return Frame(sequence=self._sequence, taken_at=now, hardware=self.hardware, system=self.system,
                     processes=ordered, status=status, host_name=self.host_name, history=self.history.view())

    @property
    def is_pipe(self) -> bool:
        """True when read by the pump thread (a pipe or terminal), False for a followed file."""
        return self._queue is not None

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def reports(self) -> int:
        return self._reports

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


__all__ = ["MonitorSource"]
