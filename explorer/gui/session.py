"""Open what the user named: one profile, a capture's folder of them, or several folders.

    session = open_session(["out/llama/device"])     # two cores -> two LoadedProfiles, one clock
    session.profiles[0].label, session.banner          # "core 0", ["core 1: capture interrupted ..."]

A capture's top folder (``out/bert``: ``device/`` and ``system/``) opens its device profiles; the
host-side system profile is left to ``neuron-profile query``. What can be opened is opened; what
cannot is named in ``banner`` (one line each) instead of stopping the whole session -- a capture
with one corrupt table still shows the rest. Only when nothing at all can be shown does
``SessionError`` (one line) say why.

Time: profiles found under the same argument come from one capture and share one device clock, so
they share one origin (their earliest timestamp) and line up on the timeline; profiles from
different arguments each start at 0. Every time the GUI shows is relative to the origin.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.read_api import (
    Profile,
    ProfileEntry,
    ProfileError,
    TrackViewport,
    capture_state,
    connect,
    device_entries,
    find_profiles,
    in_incomplete_capture,
    open_profile,
    system_only,
)


class SessionError(Exception):
    """Nothing could be opened; ``str()`` is one line."""


@dataclass
class LoadedProfile:
    """One opened device profile with the connections the GUI queries it through.

    ``tracks`` (timeline windows) and ``queries`` (details, search, summaries) are separate DuckDB
    connections so a long box-select summary never holds up the timeline's frames."""

    profile: Profile
    path: Path
    label: str
    origin: int
    notes: list[str] = field(default_factory=list)
    tracks: TrackViewport | None = None
    queries: Any = None  # a QueryConnection (formats.sqlsource connection + lock), set by open_session

    incomplete: bool = False  # an interrupted capture (``formats.dataset.capture_state``, or a folder above)
    warm_up: bool = False  # a warm-up execution kept in place of the one asked for
    longest_instruction_ns: int | None = None  # found on first use (region lookbacks are bounded by it)

    @property
    def instructions(self) -> int:
        return self.profile.num_rows("Instruction")

    @property
    def metadata(self) -> dict[str, Any]:
        return self.profile.metadata

    @property
    def instance(self) -> str:
        return str(self.profile.metadata.get("instance_type") or "unknown instance")

    def close(self) -> None:
        """Close the connections and drop them (DuckDB objects left alive at exit are reported as
        leaks by its bindings)."""
        for closable in (self.tracks, self.queries):
            if closable is not None:
                closable.close()
        self.tracks = self.queries = None


class QueryConnection:
    """A DuckDB connection for one-off queries, serialised by a lock (DuckDB connections are not
    safe to share between threads without one)."""

    def __init__(self, memory_limit: str = "512MB") -> None:
        import threading

        self.con = connect(memory_limit=memory_limit)
        self.lock = threading.Lock()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self.lock:
            cursor = self.con.execute(sql, list(params))
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, values)) for values in cursor.fetchall()]

    def numpy(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any]:
        with self.lock:
            return self.con.execute(sql, list(params)).fetchnumpy()

    def close(self) -> None:
        with self.lock:
            self.con.close()


@dataclass
class Session:
    """Everything opened from the command line (or the Open dialog)."""

    profiles: list[LoadedProfile]
    banner: list[str] = field(default_factory=list)
    title: str = ""

    def close(self) -> None:
        for loaded in self.profiles:
            loaded.close()


def open_tolerant(path: Path) -> tuple[Profile, list[str]]:
    """``open_profile``, leaving out (whole) a table with an unreadable Parquet part (truncated,
    corrupt), with a note naming it: the rule ``view`` and ``analyze`` follow (``left_out``)."""
    notes: list[str] = []
    return open_profile(path, left_out=notes), notes


def _root_name(root: Path) -> str:
    """``sample_profiles/bert-layer/device`` -> ``bert-layer`` (a capture's device/ folder is named by
    the capture), anything else by its own name."""
    resolved = root.resolve()
    return resolved.parent.name if resolved.name == "device" else resolved.name


def _labels(entries: Sequence[ProfileEntry]) -> list[str]:
    """Short names within one argument: the partition values that differ between its profiles
    (``core 0``, ``core 1``), else their relative paths; "" for a lone profile."""
    if len(entries) == 1:
        return [""]
    keys = sorted({k for e in entries for k in e.partitions})
    varying = [k for k in keys if len({e.partitions.get(k) for e in entries}) > 1]
    if varying:
        return [" ".join(f"{k} {e.partitions.get(k, '?')}" for k in varying) for e in entries]
    return [e.name for e in entries]


def _profile_notes(profile: Profile, label: str) -> list[str]:
    notes = []
    if not profile.complete:
        notes.append(f"{label}: capture interrupted -- the tables hold what was recorded up to then")
    if profile.num_rows("Instruction") == 0:
        notes.append(
            f"{label}: no instructions in this profile (Instruction table "
            f"{'empty' if profile.has('Instruction') else 'missing'})"
        )
    notes += [f"{label}: {note}" for note in profile.notes if not note.startswith("tables not in the schema")]
    notes += [
        f"{label}: warning: {w.category}: {w.message}"
        for w in profile.warnings[:3]
        if w.category != "Incomplete Profile"
    ]
    return notes


def _origin(profiles: Sequence[Profile]) -> int:
    firsts = [
        int(p.metadata["first_hw_timestamp"])
        for p in profiles
        if p.metadata.get("first_hw_timestamp") is not None
    ]
    return min(firsts, default=0)


def open_session(paths: Sequence[str | os.PathLike[str]], *, connect: bool = True) -> Session:
    """Open every profile under ``paths``. Raises ``SessionError`` (one line) if none opens."""
    if not paths:
        raise SessionError("no profile given: name a profile directory or a capture's device/ folder")
    loaded: list[LoadedProfile] = []
    banner: list[str] = []
    first_error: str | None = None
    for raw in paths:
        root = Path(raw)
        try:
            found, _ = find_profiles(root, include_incomplete=True)
        except ProfileError as exc:
            first_error = first_error or str(exc)
            banner.append(str(exc))
            continue
        # A capture's top folder holds device/ and system/: the timeline shows the device runs (the
        # system profile's host clock is not the device clock; mixing them spans decades).
        entries = device_entries(found)[0]
        if not entries:
            message = system_only(root, "neuron-explorer")
            first_error = first_error or message
            banner.append(message)
            continue
        opened: list[tuple[Profile, ProfileEntry, list[str]]] = []
        for entry in entries:
            try:
                profile, notes = open_tolerant(entry.path)
            except ProfileError as exc:
                first_error = first_error or str(exc)
                banner.append(str(exc))
                continue
            opened.append((profile, entry, notes))
        if not opened:
            continue
        labels = _labels([e for _, e, _ in opened])
        origin = _origin([p for p, _, _ in opened])
        for (profile, entry, notes), label in zip(opened, labels):
            name = label or _root_name(root)
            if label and len(paths) > 1:
                name = f"{_root_name(root)} {label}"
            item = LoadedProfile(profile, profile.path, name, origin, [f"{name}: {n}" for n in notes])
            state = capture_state(entry.path)
            item.incomplete = state.incomplete or not profile.complete or in_incomplete_capture(entry.path)
            item.warm_up = state.warm_up
            item.notes += _profile_notes(profile, name)
            loaded.append(item)
    if not loaded:
        raise SessionError(first_error or "nothing to open")
    for item in loaded:
        banner += item.notes
        if connect:
            item.tracks = TrackViewport(item.profile)
            item.queries = QueryConnection()
    title = ", ".join(str(Path(p)) for p in paths)
    return Session(loaded, banner, title)
