"""Which source files a profile may make a viewer read, and reading them without surprises.

    access = SourceAccess.for_profile(profile.metadata, source_root=Path("~/src").expanduser())
    text = read_source("/home/ci/llama/model.py", access)            # a SourceText, never an exception
    text.status is SourceStatus.OK and text.lines[28]
    text.status is SourceStatus.NEEDS_CONFIRM and text.path          # ask the user, then:
    read_source("/etc/passwd", access.confirm(text.path))

A profile names source files (``StackFrameFileName.name``, ``nki_source_location``,
``bir_debug_info_source_location``), and a profile may come from someone else: a name in it is a
request, not a permission. One rule, used by the terminal viewer and the GUI alike:

1. **Find** the recorded name: under ``--source-root`` by its longest suffix (``/home/ci/build/llama/
   model.py`` -> ``ROOT/llama/model.py``, then ``ROOT/model.py``), then at the recorded path itself.
2. **Read without asking** only when the file's real path (symlinks and ``..`` resolved) lies under a
   trusted root: the ``--source-root`` the user gave, or the directory the capture ran in
   (``Metadata.capture_working_dir``, written by our capture). The recorded directory is itself
   profile data, so it counts only when it is plausibly the user's own code: an existing directory
   this user owns, at least two levels deep, not the home directory or above it, and not under
   ``/etc``, ``/proc``, ``/sys``, ``/dev`` or ``/boot``.
3. **Anything else** (``/etc/passwd``, another user's files, a symlink out of the tree) is read only
   after the user confirms that exact real path in the viewer (``SourceAccess.confirm``).
4. **Only regular files**, at most ``MAX_BYTES`` and ``MAX_LINES``, opened non-blocking (a FIFO put in
   the file's place between the check and the open cannot hang the reader); names over ``NAME_MAX``
   bytes per part or ``PATH_MAX`` in all, with NUL bytes or unencodable characters are refused. Every
   refusal is a ``SourceText`` with a one-line ``message``; nothing here raises.

Control characters in the file (other than tabs, expanded to spaces) are shown as ``\\ufffd``: a
file's bytes never reach the terminal as escape sequences.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

MAX_BYTES = 8 * 1024 * 1024  # a "source file" bigger than this is not one a person reads in a pane
MAX_LINES = 50_000
NAME_MAX = 255  # bytes per path component (Linux NAME_MAX)
PATH_MAX = 4096  # bytes for the whole name (Linux PATH_MAX)
WORKING_DIR_FIELD = "capture_working_dir"  # Metadata extension column our capture writes
_SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run")
_CONTROL = {c: "\ufffd" for c in (*range(0, 9), *range(10, 32), 127, *range(128, 160))}


class SourceStatus(enum.Enum):
    """What became of one request to read a recorded source file."""

    OK = "ok"
    NOT_FOUND = "not found"
    NEEDS_CONFIRM = "needs confirmation"  # exists, outside every trusted root: ask the user first
    REFUSED = "refused"  # not a regular file, too big, an invalid name
    UNREADABLE = "unreadable"  # found and allowed, but the OS said no (permissions, I/O error)


@dataclass(frozen=True)
class SourceText:
    """One recorded file as a viewer shows it: its lines, or a one-line message saying why not."""

    recorded: str
    status: SourceStatus
    lines: tuple[str, ...] = ()
    message: str = ""
    path: Path | None = None  # the real path found (what NEEDS_CONFIRM asks about)
    shown_as: str = ""  # the name to show: relative to the root it was found under, else the recorded one


@dataclass(frozen=True)
class SourceAccess:
    """The roots a viewer may read source files under without asking, and the files the user allowed.

    Immutable: ``confirm`` returns a new value, so a worker thread always reads with one consistent
    policy."""

    source_root: Path | None = None  # the user's --source-root (trusted as given)
    working_dir: Path | None = None  # the capture's recorded working directory, if it passed the checks
    working_dir_note: str = ""  # why a recorded directory was not trusted ("" when none was recorded)
    confirmed: frozenset[Path] = field(default_factory=frozenset)

    @classmethod
    def for_profile(cls, metadata: Mapping[str, Any] | None, source_root: Path | None = None) -> SourceAccess:
        """The policy for a profile with ``metadata`` (its Metadata row) and the user's --source-root."""
        recorded = (metadata or {}).get(WORKING_DIR_FIELD)
        working, note = (None, "") if recorded in (None, "") else trusted_working_dir(str(recorded))
        return cls(source_root, working, note)

    def confirm(self, path: Path) -> SourceAccess:
        """This policy plus ``path`` (a real path the user agreed to read)."""
        return replace(self, confirmed=self.confirmed | {path})

    @property
    def roots(self) -> tuple[Path, ...]:
        """Real paths of the trusted roots, the user's own first."""
        out = []
        for root in (self.source_root, self.working_dir):
            real = _realpath(root) if root is not None else None
            if real is not None and real not in out:
                out.append(real)
        return tuple(out)

    def allows(self, real: Path) -> bool:
        """True when the real path ``real`` may be read without asking."""
        return real in self.confirmed or any(_under(real, root) for root in self.roots)

    def describe(self) -> str:
        """The trusted roots in words, for messages."""
        parts = []
        if self.source_root is not None:
            parts.append(f"--source-root {self.source_root}")
        if self.working_dir is not None:
            parts.append(f"the capture's working directory {self.working_dir}")
        return " or ".join(parts) if parts else "no trusted directory (no --source-root, none recorded)"


def trusted_working_dir(recorded: str) -> tuple[Path | None, str]:
    """(the recorded capture directory as a trusted root, or None and why not)."""
    problem = check_name(recorded)
    if problem:
        return None, f"recorded working directory not used: {problem}"
    real = _realpath(Path(recorded))
    try:
        info = os.stat(real) if real is not None else None
    except (OSError, ValueError):
        info = None
    if real is None or info is None or not stat.S_ISDIR(info.st_mode):
        return None, f"recorded working directory {recorded} is not a directory here"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return None, f"recorded working directory {real} belongs to another user"
    if len(real.parts) < 3:  # "/" and "/x"
        return None, f"recorded working directory {real} is too close to the file-system root"
    if any(_under(real, Path(d)) for d in _SYSTEM_DIRS):
        return None, f"recorded working directory {real} is a system directory"
    home = _realpath(Path.home())
    if home is not None and _under(home, real):
        return None, f"recorded working directory {real} is the home directory or above it"
    return real, ""


def check_name(recorded: str) -> str:
    """Why ``recorded`` cannot name a file to read ("" when it can): empty, NUL bytes, characters the
    file system cannot encode, a part over NAME_MAX or the whole over PATH_MAX bytes."""
    if not isinstance(recorded, str) or not recorded.strip():
        return "empty file name"
    if "\x00" in recorded:
        return "file name contains a NUL byte"
    try:
        encoded = os.fsencode(recorded)
    except (UnicodeError, ValueError):
        return "file name has characters this file system cannot encode"
    if len(encoded) > PATH_MAX:
        return f"file name is {len(encoded):,} bytes (more than {PATH_MAX})"
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        return f"a part of the file name is {longest:,} bytes (more than {NAME_MAX})"
    return ""


def locate(recorded: str, source_root: Path | None) -> Path | None:
    """Where ``recorded`` is on this machine (not yet resolved): under ``source_root`` by its longest
    matching suffix, else at the recorded path. None when neither exists (or the name is invalid)."""
    if check_name(recorded):
        return None
    pure = PurePath(recorded)
    parts = [p for p in pure.parts if p not in (pure.anchor, "", ".", "..")]
    candidates: list[Path] = []
    if source_root is not None:
        candidates += [source_root.joinpath(*parts[i:]) for i in range(len(parts))]
    candidates.append(Path(recorded))
    for candidate in candidates:
        try:
            if candidate.exists():
                return candidate
        except (OSError, ValueError):
            continue
    return None


def read_source(recorded: str, access: SourceAccess) -> SourceText:
    """The recorded file's lines under ``access``, or a SourceText saying why not (never raises)."""
    try:
        return _read(recorded, access)
    except Exception as exc:  # the last guard: a pane shows a line, the viewer keeps running
        return SourceText(str(recorded)[:300], SourceStatus.UNREADABLE,
                          message=f"cannot read: {_one_line(exc)}")


def _read(recorded: str, access: SourceAccess) -> SourceText:
    shown = _printable(recorded)
    problem = check_name(recorded)
    if problem:
        return SourceText(recorded, SourceStatus.REFUSED, message=f"cannot show this source file: {problem}")
    found = locate(recorded, access.source_root)
    if found is None:
        hint = "under the --source-root or " if access.source_root is not None else ""
        tail = "" if access.source_root is not None else " (pass --source-root DIR if the files moved)"
        return SourceText(recorded, SourceStatus.NOT_FOUND,
                          message=f"source file not found {hint}at its recorded path: {shown}{tail}")
    real = _realpath(found)
    if real is None:
        return SourceText(recorded, SourceStatus.NOT_FOUND, message=f"source file not found: {shown}")
    try:
        info = os.stat(real)
    except OSError as exc:
        return SourceText(recorded, SourceStatus.UNREADABLE,
                          message=f"cannot read {shown}: {exc.strerror or exc}")
    if not stat.S_ISREG(info.st_mode):
        return SourceText(recorded, SourceStatus.REFUSED, path=real,
                          message=f"not shown: {_printable(str(real))} is not a regular file")
    if info.st_size > MAX_BYTES:
        return SourceText(recorded, SourceStatus.REFUSED, path=real,
                          message=f"not shown: {_printable(str(real))} is {info.st_size / 2**20:.1f} MiB "
                                  f"(more than {MAX_BYTES // 2**20} MiB)")
    if not access.allows(real):
        where = (f"is outside {access.describe()}" if access.roots else
                 "is named by a profile that records no capture directory, and no --source-root was given")
        return SourceText(recorded, SourceStatus.NEEDS_CONFIRM, path=real,
                          message=f"{_printable(str(real))} {where}: read it only if you trust this profile "
                                  f"(enter: ask)")
    try:
        lines = _read_lines(real)
    except OSError as exc:
        return SourceText(recorded, SourceStatus.UNREADABLE, path=real,
                          message=f"cannot read {shown}: {exc.strerror or exc}")
    return SourceText(recorded, SourceStatus.OK, lines, "", real, _shown_as(recorded, real, access))


def _read_lines(real: Path) -> tuple[str, ...]:
    """At most MAX_LINES lines of the regular file ``real``; opened non-blocking and not following a
    link put in its place, then checked again on the open descriptor."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(real, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        data = os.read(fd, MAX_BYTES + 1)[:MAX_BYTES]
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")
    out = []
    for number, line in enumerate(text.splitlines()):
        if number >= MAX_LINES:
            break
        out.append(line.expandtabs(4).translate(_CONTROL))
    return tuple(out)


def _shown_as(recorded: str, real: Path, access: SourceAccess) -> str:
    for root in access.roots:
        if _under(real, root) and real != root:
            return str(real.relative_to(root))
    return _printable(recorded)


def _realpath(path: Path) -> Path | None:
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):
        return None


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _printable(text: str) -> str:
    """A recorded name safe to put in a message: control characters replaced, at most 300 chars."""
    text = str(text).translate(_CONTROL).encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= 300 else text[:297] + "..."


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]

