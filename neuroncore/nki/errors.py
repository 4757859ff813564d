"""One error type for everything a kernel does wrong, naming the kernel file and line.

The real NKI toolchain reports a constraint violation (a tile too tall for the partitions, a PSUM
tile larger than its bank, a matmul operand in the wrong memory, an access out of bounds) as one
message pointing at the offending kernel line; :class:`NkiError` does the same, and the command
line prints it as one line with a non-zero exit.
"""

from __future__ import annotations


class NkiError(Exception):
    """A kernel broke a rule of the language or the hardware. ``location`` is ``file:line``."""

    def __init__(self, message: str, location: str | None = None) -> None:
        self.location = location
        self.detail = message
        super().__init__(f"{location}: {message}" if location else message)


__all__ = ["NkiError"]
