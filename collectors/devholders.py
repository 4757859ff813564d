"""Processes that hold Neuron devices open on a real host (what ``neuron-ls -a`` lists).

The driver's character devices are ``/dev/neuron<N>``; a process holds device N while one of its file
descriptors points there. A holder is a Neuron *runtime* when it has the runtime library
(``libnrt.so``) mapped; its runtime version is read from the library's file name when the name
carries one (``libnrt.so.2.21.18`` -> ``2.21.18``), else ``NA``. Processes this user may not inspect
are skipped, as the real tool can only list what it can see. ``proc_root`` lets a fixture tree stand
in for ``/proc``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_DEVICE = re.compile(r"^/dev/neuron(\d+)$")
_NRT = re.compile(r"libnrt\.so(?:\.(\d+(?:\.\d+)*))?")


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    devices: tuple[int, ...]
    runtime_version: str | None  # None: not a Neuron runtime


def _command(proc: Path) -> str:
    try:
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        return ""
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if text:
        return text
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def _runtime_version(proc: Path) -> str | None:
    try:
        maps = (proc / "maps").read_text(errors="replace")
    except OSError:
        return None
    found: str | None = None
    for match in _NRT.finditer(maps):
        version = match.group(1)
        if version and (found is None or len(version) > len(found)):
            found = version
        elif found is None:
            found = ""
    if found is None:
        return None
    return found or "NA"


def device_holders(proc_root: Path = Path("/proc")) -> list[Holder]:
    """Every process with a ``/dev/neuron*`` descriptor open, by pid."""
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return []
    out = []
    for name in entries:
        if not name.isdigit():
            continue
        proc = proc_root / name
        try:
            fds = os.listdir(proc / "fd")
        except OSError:
            continue
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(proc / "fd" / fd)
            except OSError:
                continue
            match = _DEVICE.match(target)
            if match:
                devices.add(int(match.group(1)))
        if devices:
            out.append(Holder(int(name), _command(proc), tuple(sorted(devices)), _runtime_version(proc)))
    out.sort(key=lambda h: h.pid)
    return out


__all__ = ["Holder", "device_holders"]
