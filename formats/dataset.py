"""Find the profiles under a folder: one profile, or a dataset of them in hive-style partitions.

    find_profiles("out/llama/device")
    # [ProfileEntry(path=.../model=llama_decode/core=0/execution=2, name="model=llama_decode/core=0/
    #   execution=2", partitions={"model": "llama_decode", "core": "0", "execution": "2"}), ...]

A capture writes one device profile per (model, core, execution) as ``model=<m>/core=<c>/execution=<k>/``
(``collectors.device_profile``), the layout Spark, Trino, Dask and DuckDB read as a partitioned
dataset. The query layer turns each ``key=value`` folder level into a column, so ``WHERE core = 3``
or ``GROUP BY execution`` work over many profiles at once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from formats.reader import ProfileError
from formats.schema import SCHEMA, table_of_file
from formats.writer import INCOMPLETE_CATEGORY, INCOMPLETE_SUFFIX

_PARTITION_RE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
_INCOMPLETE_RE = re.compile(re.escape(INCOMPLETE_SUFFIX) + r"(\.\d+)?$")


@dataclass(frozen=True)
class ProfileEntry:
    """One profile directory found under a root: its path relative to the root and its partitions."""

    path: Path
    name: str  # relative path from the root, "/"-separated ("." when the root is the profile)
    partitions: dict[str, str] = field(default_factory=dict)
    complete: bool = True
    system: bool = False  # a host-side system profile (``Schema.is_system_side`` of its table files)


def is_profile_dir(path: Path) -> bool:
    """True if ``path`` holds at least one ``<Table>.parquet`` of a table the schema knows."""
    return bool(_known_tables(path))


def _known_tables(path: Path) -> set[str]:
    try:
        names = os.listdir(path)
    except OSError:
        return set()
    return {named[0] for named in map(table_of_file, names) if named is not None and named[0] in SCHEMA}


def is_system_dir(path: Path) -> bool:
    """True if ``path`` is a host-side system profile (a capture's ``system/``), read from its file
    names alone (``Schema.is_system_side``; ``Profile.is_system`` is the same rule once opened)."""
    return SCHEMA.is_system_side(_known_tables(path))


def system_note(path: Path) -> str:
    """The one line each view prints for a system profile it leaves out."""
    return f"{path} is a system profile (host side); its tables are for 'neuron-profile query'"


def system_only(root: str | os.PathLike[str], tool: str) -> str:
    """The one-line error of a view of device runs named a system profile and nothing else."""
    return (f"{root}: a system (host-side) profile only; {tool} shows device profiles "
            f"(a capture's device/ folder)")


def device_entries(entries: list[ProfileEntry]) -> tuple[list[ProfileEntry], list[ProfileEntry]]:
    """(device profiles, system profiles) of ``find_profiles``' entries: a capture's top folder holds
    ``device/`` and ``system/``; views of device runs show the first and name the second."""
    return [e for e in entries if not e.system], [e for e in entries if e.system]


def find_profiles(root: str | os.PathLike[str], *, include_incomplete: bool = False
                  ) -> tuple[list[ProfileEntry], list[Path]]:
    """(profiles under ``root``, incomplete ones skipped). ``root`` itself may be a profile.

    Hidden directories are never entered (our writers leave none). Interrupted or still-running
    captures (``<dir>.incomplete``) are skipped unless ``include_incomplete``.
    Raises ``ProfileError`` (one line) if ``root`` is missing, not a directory, or holds no profile.
    """
    base = Path(root)
    if not base.exists():
        raise ProfileError(f"{base}: no such profile directory")
    if not base.is_dir():
        raise ProfileError(f"{base}: not a profile directory (a profile is a directory of "
                           f"<Table>.parquet files)")
    if is_profile_dir(base):
        return [ProfileEntry(base, ".", {}, not _INCOMPLETE_RE.search(base.name), is_system_dir(base))], []
    found: list[ProfileEntry] = []
    skipped: list[Path] = []
    for current, dirs, _files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(current)
        if here == base or not is_profile_dir(here):
            continue
        dirs[:] = []  # profiles do not nest
        complete = not _INCOMPLETE_RE.search(here.name)
        if not complete and not include_incomplete:
            skipped.append(here)
            continue
        relative = here.relative_to(base)
        partitions: dict[str, str] = {}
        for part in relative.parts:
            match = _PARTITION_RE.match(_INCOMPLETE_RE.sub("", part))
            if match:
                partitions[match.group("key")] = match.group("value")
        found.append(ProfileEntry(here, relative.as_posix(), partitions, complete, is_system_dir(here)))
    if not found:
        extra = (f" ({len(skipped)} incomplete profile(s) skipped; pass --include-incomplete)"
                 if skipped else "")
        raise ProfileError(f"{base}: not a profile, and no profile directories below it{extra}")
    return found, skipped


def in_incomplete_capture(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` or a folder above it is an interrupted capture (``<dir>.incomplete``)."""
    return any(_INCOMPLETE_RE.search(part) for part in Path(path).resolve().parts)


def partition_types(entries: list[ProfileEntry]) -> dict[str, str]:
    """DuckDB type per partition key: BIGINT when every value is an integer, else VARCHAR (so
    ``core = 3`` compares numbers, as hive-partitioned readers infer)."""
    keys: dict[str, str] = {}
    for entry in entries:
        for key, value in entry.partitions.items():
            integer = re.fullmatch(r"-?\d{1,18}", value) is not None
            keys[key] = "BIGINT" if integer and keys.get(key, "BIGINT") == "BIGINT" else "VARCHAR"
    return keys


@dataclass(frozen=True)
class CaptureState:
    """How a capture ended, as its profile records it (what every view can say about it)."""

    incomplete: bool  # folder named <dir>.incomplete, Metadata.capture_complete false, or the Warning
    reason: str | None  # the ``Incomplete Profile`` warning's message, when there is one
    warm_up: bool  # Metadata.warm_up_execution: the program ran the model fewer times than asked
    execution: int | None  # the execution the profile holds (its ``execution=`` partition)
    requested_execution: int | None  # Metadata.requested_execution (the capture's --profile-nth-exec)


def _small_table(path: Path, name: str) -> list[dict[str, object]]:
    try:
        return pq.read_table(path / f"{name}.parquet").to_pylist()
    except Exception:  # a missing or damaged table says nothing (validate is the place for that)
        return []


def _plain_int(value: object) -> int | None:
    """A Metadata number as an int, or None when it is absent or not a number (Metadata is file data:
    a profile from elsewhere may carry any type in the column)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def capture_state(path: str | os.PathLike[str]) -> CaptureState:
    """Read a profile's capture marks (folder name, Metadata, Warning) without opening it whole."""
    root = Path(path)
    metadata = (_small_table(root, "Metadata") or [{}])[0]
    reasons = [str(w.get("message") or "") for w in _small_table(root, "Warning")
               if w.get("category") == INCOMPLETE_CATEGORY]
    incomplete = bool(_INCOMPLETE_RE.search(root.name)) or metadata.get("capture_complete") is False \
        or bool(reasons)
    match = re.fullmatch(r"execution=(\d+)", _INCOMPLETE_RE.sub("", root.name))
    requested = metadata.get("requested_execution")
    # ``is True``: a warm-up mark is a bool column; any other type (a damaged or foreign file) is no
    # mark at all, and the reader refuses that Metadata with its own one line
    warm_up = metadata.get("warm_up_execution") is True
    return CaptureState(incomplete, reasons[0] if reasons else None, warm_up,
                        int(match.group(1)) if match else None,
                        _plain_int(requested))


def is_incomplete(path: str | os.PathLike[str]) -> bool:
    """True for a profile whose capture did not finish (see ``capture_state``)."""
    return capture_state(path).incomplete


def capture_notes(root: str | os.PathLike[str], *, include_incomplete: bool = False) -> list[str]:
    """One line per profile under ``root`` (or ``root`` itself) that a reader should be told about:
    an incomplete capture, or a warm-up execution kept in place of the one asked for."""
    try:
        entries, _ = find_profiles(root, include_incomplete=include_incomplete)
    except ProfileError:
        return []
    notes: list[str] = []
    for entry in entries:
        state = capture_state(entry.path)
        if state.incomplete:
            why = f": {state.reason}" if state.reason else ""
            notes.append(f"{entry.path} is an incomplete profile (capture did not finish){why}")
        if state.warm_up:
            asked = f" {state.requested_execution}" if state.requested_execution is not None else ""
            notes.append(f"{entry.path} holds a warm-up execution: the program ran the model fewer times "
                         f"than the requested execution{asked}")
    return notes
