"""Every environment variable neuronscope reads, declared once: name, type, default, meaning, readers.

    from neuronscope import settings
    settings.LIVE_DIR.get()              # Path | None: unset (or empty) is the default
    settings.LIVE_PERIOD.get()           # float; a value that does not parse raises SettingError
    env[settings.PROFILE_DIR.name] = ... # a child's environment is written through the same names

Why one registry: the variables were read in a dozen modules, each with its own idea of "unset",
"off" and "bad value". Here an empty value is unset everywhere, flags share one spelling of off
(``0``, ``false``, ``no``, ``off``), and a value that does not parse is one ``SettingError`` whose
message names the variable; the reader decides whether that is fatal (a command line) or ignored
with a warning (code running inside someone else's program). ``tests/test_settings.py`` checks that
no module reads a ``NEURONSCOPE_*`` variable any other way and that docs/settings.md lists exactly
these. This module imports nothing of ours, so the core may use it.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"1", "true", "yes", "on"})


class SettingError(ValueError):
    """A variable is set to something its reader cannot use; the message is one line naming it."""


class LiveMode(enum.Enum):
    """``NEURONSCOPE_LIVE``: when a process that runs models publishes its live state."""

    OFF = "off"  # never
    AUTO = "auto"  # only while a neuron-top / neuron-monitor is watching (collectors.livedemand)
    ON = "on"  # always, from the first execution


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable. ``parse`` turns its (non-empty) text into a value or raises
    ``ValueError``; ``get`` returns ``default`` when the variable is unset or empty."""

    name: str
    type: str  # as the docs say it: "flag", "path", "text", "int", "float", "fd", "mode"
    default: T
    meaning: str
    readers: tuple[str, ...]
    parse: Callable[[str], T]
    owner: str = "neuronscope"  # or "Neuron runtime": a variable the real tools define

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, or None when unset or empty."""
        text = (os.environ if environ is None else environ).get(self.name)
        return text if text else None

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        text = self.raw(environ)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            detail = f": {exc}" if str(exc) else ""
            raise SettingError(f"{self.name}={text!r} is not a valid {self.type}{detail}") from None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise ValueError("use 1 or 0")


def _live_mode(text: str) -> LiveMode:
    value = text.strip().lower()
    if value in _OFF:
        return LiveMode.OFF
    if value in _ON:
        return LiveMode.ON
    if value == "auto":
        return LiveMode.AUTO
    raise ValueError("use 1 (always), 0 (never) or auto (while watched)")


def _text(text: str) -> str:
    return text


def _path(text: str) -> Path:
    return Path(text)


def _int(text: str) -> int:
    return int(text)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _fd(text: str) -> int:
    if not text.isdigit():
        raise ValueError("must be a file descriptor number")
    return int(text)


def _seconds(text: str) -> float:
    return float(text)


# -- the core (neuroncore) --------------------------------------------------------------------------
INSTANCE: Setting[str | None] = Setting(
    "NEURONSCOPE_INSTANCE", "text", None,
    "default instance type (before the config file's `instance`, else trn1.2xlarge)",
    ("neuroncore.config",), _text)
CONFIG: Setting[Path | None] = Setting(
    "NEURONSCOPE_CONFIG", "path", None,
    "the config file (default `$XDG_CONFIG_HOME/neuronscope/config.toml`)",
    ("neuroncore.config",), _path)
PLUGINS: Setting[bool] = Setting(
    "NEURONSCOPE_PLUGINS", "flag", True,
    "0: attach no `neuronscope.sink_listeners` (no live state, no capture handshake)",
    ("neuroncore.plugins",), _flag)

# -- live state ---------------------------------------------------------------------------------------
LIVE: Setting[LiveMode] = Setting(
    "NEURONSCOPE_LIVE", "mode", LiveMode.AUTO,
    "live-state publishing of a process that runs models: 1 always, 0 never, auto (default) only "
    "while a neuron-top or neuron-monitor is watching",
    ("collectors.live",), _live_mode)
LIVE_PERIOD: Setting[float] = Setting(
    "NEURONSCOPE_LIVE_PERIOD", "float", 0.5,
    "seconds between live-state files (clamped to 0.02..60; a bad value warns and uses 0.5)",
    ("collectors.live",), _seconds)
LIVE_DIR: Setting[Path | None] = Setting(
    "NEURONSCOPE_LIVE_DIR", "path", None,
    "the live-state directory (default `$XDG_RUNTIME_DIR/neuronscope`, else `/dev/shm/neuronscope-<uid>`)",
    ("collectors.livepaths",), _path)

# -- neuron-profile capture: the wrapper -> child handshake ---------------------------------------
PROFILE_DIR: Setting[Path | None] = Setting(
    "NEURONSCOPE_PROFILE_DIR", "path", None,
    "set by `neuron-profile capture` for its child: where the child's device profiles go",
    ("collectors.autoprofile",), _path)
PROFILE_NTH_EXEC: Setting[int | None] = Setting(
    "NEURONSCOPE_PROFILE_NTH_EXEC", "int", None,
    "set by `neuron-profile capture`: `--profile-nth-exec` (profile each model's nth execution per core)",
    ("collectors.autoprofile",), _int)
EVENTS_FILE: Setting[Path | None] = Setting(
    "NEURONSCOPE_EVENTS_FILE", "path", None,
    "set by `neuron-profile capture`: where the child writes its runtime API events (JSON lines) at exit",
    ("collectors.autoprofile",), _path)
CAPTURE_STATUS: Setting[Path | None] = Setting(
    "NEURONSCOPE_CAPTURE_STATUS", "path", None,
    "set by `neuron-profile capture`: where the child reports a recording error at exit (JSON)",
    ("collectors.autoprofile",), _path)
WRAPPER_FD: Setting[int | None] = Setting(
    "NEURONSCOPE_WRAPPER_FD", "fd", None,
    "set by `neuron-profile capture`: a pipe's read end; end-of-file means the wrapper died and the "
    "child stops itself",
    ("collectors.autoprofile",), _fd)
ROW_GROUP_ROWS: Setting[int | None] = Setting(
    "NEURONSCOPE_ROW_GROUP_ROWS", "int", None,
    "rows per committed part file of a captured program's profiles (default 131,072; smaller loses "
    "less on a kill, costs more files)",
    ("collectors.autoprofile",), _positive_int)

# -- NKI kernels ----------------------------------------------------------------------------------
NKI_TUTORIALS: Setting[Path | None] = Setting(
    "NEURONSCOPE_NKI_TUTORIALS", "path", None,
    "a folder of AWS's NKI tutorial kernel files (nki-samples) that `bench/nki.py` runs instead of "
    "the project's own restatements",
    ("bench.nki",), _path)

# -- formats -----------------------------------------------------------------------------------------
PROFILE_SCHEMA: Setting[Path | None] = Setting(
    "NEURONSCOPE_PROFILE_SCHEMA", "path", None,
    "the reference profile-schema.json `neuron-profile validate` checks against",
    ("formats.schema",), _path)
COMMIT_LOG: Setting[Path | None] = Setting(
    "NEURONSCOPE_COMMIT_LOG", "path", None,
    "a file every committed Parquet part is appended to (crash tests, bench/kill_trials.py)",
    ("formats.writer",), _path)

# -- host and hardware sources -----------------------------------------------------------------------
IMDS: Setting[bool] = Setting(
    "NEURONSCOPE_IMDS", "flag", True,
    "0: do not ask the EC2 instance metadata service (neuron-monitor's instance_info stays empty)",
    ("collectors.instanceinfo",), _flag)
IMDS_ENDPOINT: Setting[str | None] = Setting(
    "NEURONSCOPE_IMDS_ENDPOINT", "text", None,
    "the instance metadata service's base URL (default http://169.254.169.254; tests)",
    ("collectors.instanceinfo",), _text)
SYSFS_ROOT: Setting[Path | None] = Setting(
    "NEURONSCOPE_SYSFS_ROOT", "path", None,
    "the Neuron driver's sysfs tree, when `NEURON_SYSFS_ROOT` is not set (fixtures)",
    ("collectors.sysfs",), _path)
NEURON_SYSFS_ROOT: Setting[Path | None] = Setting(
    "NEURON_SYSFS_ROOT", "path", None,
    "the Neuron driver's sysfs tree (default /sys/devices/virtual/neuron_device)",
    ("collectors.sysfs",), _path, owner="Neuron runtime")
PROCESS_TAG: Setting[str | None] = Setting(
    "NEURON_PROCESS_TAG", "text", None,
    "a process's tag in live state and neuron-monitor (first 255 characters; default the pid)",
    ("collectors.live",), _text, owner="Neuron runtime")
LOGICAL_NC_CONFIG: Setting[int | None] = Setting(
    "NEURON_LOGICAL_NC_CONFIG", "int", None,
    "logical NeuronCore size (1 or 2) of the simulated inventory (default: the instance's)",
    ("collectors.inventory",), _int, owner="Neuron runtime")
STOCHASTIC_ROUNDING: Setting[bool | None] = Setting(
    "NEURON_RT_STOCHASTIC_ROUNDING_EN", "flag", None,
    "1: engines round FP32 results stochastically when they write bf16 (expected value = the FP32 "
    "value); 0: round to nearest even. Unset: off, except a bf16-sr training step turns it on",
    ("neuroncore.runtime.device",), _flag, owner="Neuron runtime")
STOCHASTIC_ROUNDING_SEED: Setting[int | None] = Setting(
    "NEURON_RT_STOCHASTIC_ROUNDING_SEED", "int", None,
    "seed of the stochastic-rounding random bits (default 0: runs repeat exactly)",
    ("neuroncore.runtime.device",), _int, owner="Neuron runtime")

# -- benchmarks ----------------------------------------------------------------------------------------
BENCH_CACHE: Setting[Path | None] = Setting(
    "NEURONSCOPE_BENCH_CACHE", "path", None,
    "where bench/gui.py keeps its synthetic profiles (default `$TMPDIR/neuronscope-bench`)",
    ("bench.gui",), _path)

REGISTRY: tuple[Setting[Any], ...] = (
    INSTANCE, CONFIG, PLUGINS, LIVE, LIVE_PERIOD, LIVE_DIR, PROFILE_DIR, PROFILE_NTH_EXEC, EVENTS_FILE,
    CAPTURE_STATUS, WRAPPER_FD, ROW_GROUP_ROWS, NKI_TUTORIALS, PROFILE_SCHEMA, COMMIT_LOG, IMDS,
    IMDS_ENDPOINT, SYSFS_ROOT, NEURON_SYSFS_ROOT, PROCESS_TAG, LOGICAL_NC_CONFIG, STOCHASTIC_ROUNDING,
    STOCHASTIC_ROUNDING_SEED, BENCH_CACHE,
)
"""Every variable, in the order docs/settings.md lists them."""


def by_name(name: str) -> Setting[Any]:
    """The declared setting called ``name``; KeyError for a variable nobody declared."""
    for setting in REGISTRY:
        if setting.name == name:
            return setting
    raise KeyError(name)


__all__ = [
    "BENCH_CACHE", "CAPTURE_STATUS", "COMMIT_LOG", "CONFIG", "EVENTS_FILE", "IMDS", "IMDS_ENDPOINT",
    "INSTANCE", "LIVE", "LIVE_DIR", "LIVE_PERIOD", "LOGICAL_NC_CONFIG", "NEURON_SYSFS_ROOT", "NKI_TUTORIALS",
    "PLUGINS",
    "PROCESS_TAG", "PROFILE_DIR", "PROFILE_NTH_EXEC", "PROFILE_SCHEMA", "REGISTRY", "ROW_GROUP_ROWS",
    "SYSFS_ROOT", "WRAPPER_FD", "LiveMode", "Setting", "SettingError", "by_name",
]
