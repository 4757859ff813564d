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

from formats.reader import ProfileError
from formats.schema import SCHEMA, table_of_file
from formats.writer import INCOMPLETE_SUFFIX

_PARTITION_RE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
_INCOMPLETE_RE = re.compile(re.escape(INCOMPLETE_SUFFIX) + r"(\.\d+)?$")


@dataclass(frozen=True)
class ProfileEntry:
    """One profile directory found under a root: its path relative to the root and its partitions."""

    path: Path
    name: str  # relative path from the root, "/"-separated ("." when the root is the profile)
    partitions: dict[str, str] = field(default_factory=dict)
    complete: bool = True


def is_profile_dir(path: Path) -> bool:
    """True if ``path`` holds at least one ``<Table>.parquet`` of a table the schema knows."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    for name in names:
        named = table_of_file(name)
        if named is not None and named[0] in SCHEMA:
            return True
    return False


def find_profiles(root: str | os.PathLike[str], *, include_incomplete: bool = False
                  ) -> tuple[list[ProfileEntry], list[Path]]:
    """(profiles under ``root``, incomplete ones skipped). ``root`` itself may be a profile.

    Hidden directories (a writer's ``.name.XXXX.partial`` staging) are never entered; interrupted
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
        return [ProfileEntry(base, ".", {}, not _INCOMPLETE_RE.search(base.name))], []
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
        found.append(ProfileEntry(here, relative.as_posix(), partitions, complete))
    if not found:
        extra = (f" ({len(skipped)} incomplete profile(s) skipped; pass --include-incomplete)"
                 if skipped else "")
        raise ProfileError(f"{base}: not a profile, and no profile directories below it{extra}")
    return found, skipped


def partition_types(entries: list[ProfileEntry]) -> dict[str, str]:
    """DuckDB type per partition key: BIGINT when every value is an integer, else VARCHAR (so
    ``core = 3`` compares numbers, as hive-partitioned readers infer)."""
    keys: dict[str, str] = {}
    for entry in entries:
        for key, value in entry.partitions.items():
            integer = re.fullmatch(r"-?\d{1,18}", value) is not None
            keys[key] = "BIGINT" if integer and keys.get(key, "BIGINT") == "BIGINT" else "VARCHAR"
    return keys
