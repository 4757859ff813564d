"""neuron-monitor's configuration file: the real format, checked strictly, with periods resolved.

Format (sys-tools.md §1.3): a JSON object with optional ``period``, ``neuron_runtimes`` (selectors
with ``tag_filter``, ``period`` and ``metrics``) and ``system_metrics``. A group's period is the
innermost one given: metric -> runtime entry -> root -> 5 s. Durations use Go's ``time.ParseDuration``
syntax (``"1s"``, ``"500ms"``, ``"1m30s"``), a superset of the documented ``"1s"``. ``tag_filter``
is an unanchored regular-expression search (Go ``regexp.MatchString``); the first matching entry
wins. Legacy group names are mapped to current ones with a warning; unknown keys and values are
errors that name the key, so a typo never silently turns a group off.

Bounded (issue 14): the file is a regular file of at most ``MAX_CONFIG_BYTES`` (a FIFO is refused
without being opened), nesting Python cannot decode is a ConfigError, periods are at most
``MAX_PERIOD_S`` (a huge one used to reach ``sleep(inf)``), a configuration that collects nothing
is refused (it would sleep forever), and ``tag_filter`` is at most ``MAX_PATTERN_CHARS`` characters
in the part of the syntax Go's RE2 shares with Python, with no repeat or alternation inside an
unbounded repeat (``(a+)+``, ``(a|aa)*``),
so neither compiling it nor matching a 255-character tag can take long.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # typeshed describes the stdlib's regex parser under its old public name
    import sre_parse
else:  # the same module; importing it by that name warns (deprecated since 3.11)
    from re import _parser as sre_parse

from collectors.reportvalues import brief

RUNTIME_GROUPS = ("neuroncore_counters", "execution_stats", "memory_used", "neuron_runtime_vcpu_usage")
SYSTEM_GROUPS = ("vcpu_usage", "memory_info", "neuron_hw_counters")
LEGACY_NAMES = {
    "inference_stats": "execution_stats",
    "nc_counters": "neuroncore_counters",
    "runtime_cpu_usage": "neuron_runtime_vcpu_usage",
    "hw_counters": "neuron_hw_counters",
}
DEFAULT_PERIOD_S = 5.0
MIN_PERIOD_S = 0.01
MAX_PERIOD_S = 86400.0  # a day; Go allows ~292 years, but no one samples that rarely
MAX_DURATION_CHARS = 64
MAX_PATTERN_CHARS = 1024
MAX_CONFIG_BYTES = 1 << 20
MAX_ENTRIES = 256  # neuron_runtimes entries

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class ConfigError(ValueError):
    """A configuration problem, already phrased as the one line the user sees."""


@dataclass(frozen=True)
class GroupSpec:
    """One metric group to collect and its resolved period."""

    type: str
    period_s: float


@dataclass(frozen=True)
class RuntimeSelector:
    """A ``neuron_runtimes`` entry: which applications (by tag) and which groups from them."""

    tag_filter: str | None
    groups: tuple[GroupSpec, ...]
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    def matches(self, tag: str) -> bool:
        return self.pattern is None or self.pattern.search(tag) is not None


@dataclass(frozen=True)
class MonitorConfig:
    runtimes: tuple[RuntimeSelector, ...]
    system: tuple[GroupSpec, ...]
    warnings: tuple[str, ...] = ()

    def selector_for(self, tag: str) -> int | None:
        """Index of the first ``neuron_runtimes`` entry whose filter matches ``tag``."""
        for index, selector in enumerate(self.runtimes):
            if selector.matches(tag):
                return index
        return None


def parse_duration(text: Any, where: str) -> float:
    """Seconds of a Go-style duration string such as ``"1s"``, ``"500ms"`` or ``"1m30s"``."""
    if not isinstance(text, str):
        raise ConfigError(f"{where}: expected a duration string like \"1s\", got {brief(text)}")
    if len(text) > MAX_DURATION_CHARS:
        raise ConfigError(f"{where}: duration of {len(text)} characters is not a duration")
    s = text.strip()
    pos, total = 0, 0.0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None:
            raise ConfigError(f"{where}: invalid duration {text!r} (use e.g. \"1s\", \"500ms\", \"1m30s\")")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not s:
        raise ConfigError(f"{where}: empty duration")
    if total < MIN_PERIOD_S:
        raise ConfigError(f"{where}: period {text!r} is too short (minimum {MIN_PERIOD_S * 1000:g}ms)")
    if not total <= MAX_PERIOD_S:  # also catches inf from a very long number
        raise ConfigError(f"{where}: period {text!r} is too long (maximum {MAX_PERIOD_S / 3600:g}h)")
    return total


def _nested_repeat(items: Any, inside: bool = False) -> bool:
    """True if a parsed pattern has an unbounded repeat or an alternation inside an unbounded repeat
    (``(a+)+``, ``(a*b?)*``, ``(a|aa)*``), the shapes whose backtracking grows exponentially with the
    tag's length (Go's RE2 has no backtracking; Python's ``re`` does)."""
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _low, high, body = arg
            unbounded = high > 1
            if unbounded and inside:
                return True
            if _nested_repeat(body, inside or unbounded):
                return True
        elif name == "SUBPATTERN":
            if _nested_repeat(arg[-1], inside):
                return True
        elif name == "BRANCH":
            if inside or any(_nested_repeat(branch, inside) for branch in arg[1]):
                return True  # (a|aa)* backtracks exponentially too
        elif name in ("ASSERT", "ASSERT_NOT", "GROUPREF", "GROUPREF_EXISTS"):
            return True  # not in Go's RE2 syntax either
    return False


def compile_tag_filter(pattern: str, where: str) -> re.Pattern[str]:
    """A ``tag_filter`` compiled, after the checks that keep compiling and matching it fast."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ConfigError(f"{where}: regular expression of {len(pattern):,} characters is over the "
                          f"{MAX_PATTERN_CHARS:,} limit")
    try:
        parsed = sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        reason = exc if isinstance(exc, re.error) else "too complex"
        raise ConfigError(f"{where}: invalid regular expression {brief(pattern)}: {reason}") from None
    if _nested_repeat(parsed.data if hasattr(parsed, "data") else parsed):
        raise ConfigError(f"{where}: regular expression {brief(pattern)} repeats a repeat or an "
                          "alternation, or uses look-around or back-references (too slow to match)")
    return compiled


def default_config() -> MonitorConfig:
    """No config file: every group, every application, every 5 s (sys-tools.md §1.2)."""
    return MonitorConfig(
        runtimes=(RuntimeSelector(None, tuple(GroupSpec(g, DEFAULT_PERIOD_S) for g in RUNTIME_GROUPS)),),
        system=tuple(GroupSpec(g, DEFAULT_PERIOD_S) for g in SYSTEM_GROUPS))


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is dict and not isinstance(value, dict)):
        raise ConfigError(f"{where}: expected {what}, got {brief(value)}")
    return value


def _check_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in allowed:
            name = brief(key)[1:-1]
            raise ConfigError(f"{where}.{name}: unknown key (allowed: {', '.join(allowed)})"
                              if where else f"{name}: unknown key (allowed: {', '.join(allowed)})")


def _group_name(value: Any, allowed: tuple[str, ...], where: str, warnings: list[str]) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a metric group name, got {brief(value)}")
    if value in LEGACY_NAMES and LEGACY_NAMES[value] in allowed:
        warnings.append(f"{where}: {value!r} is the old name of {LEGACY_NAMES[value]!r}; using that")
        return LEGACY_NAMES[value]
    if value not in allowed:
        raise ConfigError(f"{where}: unknown metric group {brief(value)} (known: {', '.join(allowed)})")
    return value


def _groups(items: Any, where: str, allowed: tuple[str, ...], default_period: float,
            warnings: list[str]) -> tuple[GroupSpec, ...]:
    _expect(items, list, where, "a list of {\"type\": ...} objects")
    out: list[GroupSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        _expect(item, dict, at, "an object")
        _check_keys(item, ("type", "period"), at)
        if "type" not in item:
            raise ConfigError(f"{at}.type: missing")
        name = _group_name(item["type"], allowed, f"{at}.type", warnings)
        period = parse_duration(item["period"], f"{at}.period") if "period" in item else default_period
        if name in seen:
            raise ConfigError(f"{at}.type: {name!r} is listed twice")
        seen.add(name)
        out.append(GroupSpec(name, period))
    return tuple(out)


def parse_config(data: Any, source: str = "config") -> MonitorConfig:
    """Check a parsed config and resolve its periods; ConfigError names the offending key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the configuration must be a JSON object")
    warnings: list[str] = []
    try:
        _check_keys(data, ("period", "neuron_runtimes", "system_metrics"), "")
        root = parse_duration(data["period"], "period") if "period" in data else DEFAULT_PERIOD_S
        runtimes: list[RuntimeSelector] = []
        entries = _expect(data.get("neuron_runtimes", []), list, "neuron_runtimes", "a list")
        if len(entries) > MAX_ENTRIES:
            raise ConfigError(f"neuron_runtimes: {len(entries):,} entries (limit {MAX_ENTRIES})")
        for i, entry in enumerate(entries):
            at = f"neuron_runtimes[{i}]"
            _expect(entry, dict, at, "an object")
            _check_keys(entry, ("tag_filter", "period", "metrics", "address"), at)
            if "address" in entry:
                warnings.append(f"{at}.address: Neuron 1.x setting, ignored")
            pattern = None
            tag_filter = entry.get("tag_filter")
            if tag_filter is not None:
                _expect(tag_filter, str, f"{at}.tag_filter", "a regular expression string")
                pattern = compile_tag_filter(tag_filter, f"{at}.tag_filter")
            period = parse_duration(entry["period"], f"{at}.period") if "period" in entry else root
            groups = _groups(entry.get("metrics", []), f"{at}.metrics", RUNTIME_GROUPS, period, warnings)
            runtimes.append(RuntimeSelector(tag_filter, groups, pattern))
        system = _groups(data.get("system_metrics", []), "system_metrics", SYSTEM_GROUPS, root, warnings)
        if not system and not any(r.groups for r in runtimes):
            raise ConfigError("selects no metric group, so there would never be a report "
                              "(add neuron_runtimes metrics or system_metrics)")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return MonitorConfig(tuple(runtimes), system, tuple(f"{source}: {w}" for w in warnings))


def load_config(path: str | Path) -> MonitorConfig:
    """Read and check a config file; every failure is a one-line ConfigError."""
    path = Path(path)
    try:
        info = os.stat(path)  # before opening: opening a FIFO would wait for a writer
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"config file {path} is not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {path} is {info.st_size:,} bytes (limit {MAX_CONFIG_BYTES:,})")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # swapped for a FIFO since the stat: no wait
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ConfigError(f"config file {path} is not a regular file")
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is over {MAX_CONFIG_BYTES:,} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    except ValueError as exc:  # an integer over the interpreter's digit limit
        raise ConfigError(f"{path}: not valid JSON: {str(exc)[:80]}") from None
    return parse_config(data, str(path))


__all__ = ["DEFAULT_PERIOD_S", "LEGACY_NAMES", "MAX_PATTERN_CHARS", "MAX_PERIOD_S", "RUNTIME_GROUPS",
           "SYSTEM_GROUPS", "ConfigError", "GroupSpec", "MonitorConfig", "RuntimeSelector",
           "compile_tag_filter", "default_config", "load_config", "parse_config", "parse_duration"]
