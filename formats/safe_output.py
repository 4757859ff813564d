"""Output files created without following links: the one way every exporter writes a file.

``neuron-profile view -o X`` and ``query -o X`` run on shared hosts, in folders other users can write.
Opening ``X`` (or a fixed ``X.partial`` staging name) with a plain ``open(..., "w")`` follows a symlink
someone placed there and overwrites whatever it points at. So:

* the target ``X`` is refused when it is a symbolic link (or anything but a regular file, if it exists);
* the data go to a fresh temporary name in the same directory, created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` -- ``O_EXCL`` fails on any existing entry, a dangling symlink
  included, so nothing placed in advance is ever written through -- and mode 0666 minus the umask;
* on success the temporary file is renamed over ``X`` (``rename`` replaces the directory entry, never
  follows it); on failure it is removed and ``X`` is left as it was.

A reader never sees a half-written ``X``, and a failed export leaves no stray file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any


class UnsafeOutputError(OSError):
    """The output path cannot be written safely (a symlink, a directory, a device ...): one line."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unsafe output path"


def check_target(path: str | os.PathLike[str]) -> None:
    """Refuse a target that is a symlink or exists as anything but a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeOutputError(f"{os.fspath(path)}: is a symbolic link; refusing to write through it "
                                f"(remove it or choose another output file)")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeOutputError(f"{os.fspath(path)}: exists and is not a regular file")


def _create_temp(path: str) -> tuple[int, str]:
    """A new, empty file next to ``path`` that did not exist before (never a pre-placed link)."""
    directory, name = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.partial")
        try:
            return os.open(temp, flags, 0o666), temp
        except FileExistsError:
            continue
    raise UnsafeOutputError(f"{path}: cannot create a temporary file next to it")


def output_file(path: str | os.PathLike[str], mode: str = "wb") -> contextlib.AbstractContextManager[IO[Any]]:
    """``with output_file(path, "wb") as out:`` -- write ``out``; ``path`` appears (atomically) only
    when the block ends without an exception. ``mode`` is ``"wb"`` or ``"w"`` (UTF-8 text)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"output_file mode must be 'wb' or 'w', not {mode!r}")
    return _output_file(os.fspath(path), mode)


@contextlib.contextmanager
def _output_file(path: str, mode: str) -> Iterator[IO[Any]]:
    check_target(path)
    fd, temp = _create_temp(path)
    done = False
    try:
        out: IO[Any] = os.fdopen(fd, "w", encoding="utf-8") if mode == "w" else os.fdopen(fd, "wb")
        with out:
            yield out
        check_target(path)  # placed while we were writing: still never replaced through
        os.replace(temp, path)
        done = True
    finally:
        if not done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
