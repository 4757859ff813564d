"""Can Qt's xcb platform plugin load here? Asked before any QApplication exists.

Without one of the plugin's system libraries (typically ``libxcb-cursor0``, required since Qt 6.5)
Qt prints a paragraph about plugins and aborts the process (SIGABRT, no Python exception), so the
application cannot catch it. ``missing_xcb_libraries`` loads the plugin the way Qt will (``dlopen``)
and, when that fails, lists every shared library it cannot find (the loader's message names the
first; ``ldd``, when present, names the rest). ``install_hint`` turns sonames into the Debian/Ubuntu
package names (``libxcb-cursor.so.0`` -> ``libxcb-cursor0``), so the error is one line with the fix.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

_MISSING_RE = re.compile(r"(lib[\w.+-]+?\.so(?:\.\d+)*): cannot open shared object file")
_LDD_RE = re.compile(r"^\s*(\S+\.so(?:\.\d+)*) => not found", re.MULTILINE)


def uses_xcb(env: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """True when Qt will pick the xcb (X11) platform plugin: Linux, and either ``QT_QPA_PLATFORM``
    names xcb or it is unset with an X display and no Wayland one."""
    env = os.environ if env is None else env
    if (platform or sys.platform) != "linux":
        return False
    chosen = env.get("QT_QPA_PLATFORM", "").split(":", 1)[0].split(";", 1)[0].strip()
    if chosen:
        return chosen == "xcb"
    return bool(env.get("DISPLAY")) and not env.get("WAYLAND_DISPLAY")


def xcb_plugin() -> Path | None:
    """The installed Qt's ``libqxcb.so`` (None when this Qt has none, e.g. not a Linux build)."""
    from PySide6.QtCore import QLibraryInfo

    plugins = Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath))
    found = plugins / "platforms" / "libqxcb.so"
    return found if found.is_file() else None


def missing_libraries(
    library: Path, load: Callable[[str], object] = ctypes.CDLL, ldd: str | None = None
) -> list[str]:
    """Sonames ``library`` needs and the loader cannot find; [] when it loads."""
    try:
        load(str(library))
        return []
    except OSError as exc:
        missing = _MISSING_RE.findall(str(exc))
    tool = ldd if ldd is not None else shutil.which("ldd")
    if tool:
        try:
            listed = subprocess.run([tool, str(library)], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            listed = ""
        missing += _LDD_RE.findall(listed)
    missing = list(dict.fromkeys(missing))
    return missing or ["(a library the xcb plugin needs; run: ldd " + str(library) + ")"]


def package_of(soname: str) -> str:
    """Debian/Ubuntu package of a soname: ``libxcb-cursor.so.0`` -> ``libxcb-cursor0``,
    ``libxkbcommon-x11.so.0`` -> ``libxkbcommon-x11-0`` (a dash when the name ends in a digit)."""
    name, _, version = soname.partition(".so")
    major = version.lstrip(".").split(".", 1)[0]
    name = name.lower()
    if not major:
        return name
    return f"{name}-{major}" if name[-1].isdigit() else f"{name}{major}"


def install_hint(sonames: list[str]) -> str:
    """``apt-get install PKG ...`` for the sonames (those that look like sonames)."""
    packages = [package_of(s) for s in sonames if ".so" in s and s.startswith("lib")]
    if not packages:
        return "install Qt's xcb dependencies"
    return f"apt-get install {' '.join(dict.fromkeys(packages))}"


def missing_xcb_libraries(env: Mapping[str, str] | None = None) -> list[str]:
    """What stops Qt's xcb plugin from loading, when Qt would use it; [] otherwise."""
    if not uses_xcb(env):
        return []
    plugin = xcb_plugin()
    return missing_libraries(plugin) if plugin is not None else []


def xcb_error(missing: list[str]) -> str:
    """The one line the command prints."""
    return (
        f"Qt's xcb (X11) platform plugin cannot load: missing {', '.join(missing)}; fix: "
        f"{install_hint(missing)} (or render without a display: --screenshot PNG)"
    )


__all__ = [
    "install_hint", "missing_libraries", "missing_xcb_libraries", "package_of", "uses_xcb", "xcb_error",
]
