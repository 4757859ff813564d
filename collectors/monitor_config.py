"""neuron-monitor's configuration file: the real format, checked strictly, with periods resolved.

Format (sys-tools.md §1.3): a JSON object with optional ``period``, ``neuron_runtimes`` (selectors
with ``tag_filter``, ``period`` and ``metrics``) and ``system_metrics``. A group's period is the
innermost one given: metric -> runtime entry -> root -> 5 s. Durations use Go's ``time.ParseDuration``
syntax (``"1s"``, ``"500ms"``, ``"1m30s"``), a superset of the documented ``"1s"``. ``tag_filter``
is an unanchored regular-expression search (Go ``regexp.MatchString``); the first matching entry
wins. Legacy group names are mapped to current ones with a warning; unknown keys and values are
errors that name the key, so a typo never silently turns a group off.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        raise ConfigError(f"{where}: expected a duration string like \"1s\", got {json.dumps(text)}")
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
    return total


def default_config() -> MonitorConfig:
    """No config file: every group, every application, every 5 s (sys-tools.md §1.2)."""
    return MonitorConfig(
        runtimes=(RuntimeSelector(None, tuple(GroupSpec(g, DEFAULT_PERIOD_S) for g in RUNTIME_GROUPS)),),
        system=tuple(GroupSpec(g, DEFAULT_PERIOD_S) for g in SYSTEM_GROUPS))


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is dict and not isinstance(value, dict)):
        raise ConfigError(f"{where}: expected {what}, got {json.dumps(value)[:60]}")
    return value


def _check_keys(obj: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown key (allowed: {', '.join(allowed)})"
                              if where else f"{key}: unknown key (allowed: {', '.join(allowed)})")


def _group_name(value: Any, allowed: tuple[str, ...], where: str, warnings: list[str]) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a metric group name, got {json.dumps(value)}")
    if value in LEGACY_NAMES and LEGACY_NAMES[value] in allowed:
        warnings.append(f"{where}: {value!r} is the old name of {LEGACY_NAMES[value]!r}; using that")
        return LEGACY_NAMES[value]
    if value not in allowed:
        raise ConfigError(f"{where}: unknown metric group {value!r} (known: {', '.join(allowed)})")
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
        for i, entry in enumerate(_expect(data.get("neuron_runtimes", []), list, "neuron_runtimes",
                                          "a list")):
            at = f"neuron_runtimes[{i}]"
            _expect(entry, dict, at, "an object")
            _check_keys(entry, ("tag_filter", "period", "metrics", "address"), at)
            if "address" in entry:
                warnings.append(f"{at}.address: Neuron 1.x setting, ignored")
            pattern = None
            tag_filter = entry.get("tag_filter")
            if tag_filter is not None:
                _expect(tag_filter, str, f"{at}.tag_filter", "a regular expression string")
                try:
                    pattern = re.compile(tag_filter)
                except re.error as exc:
                    raise ConfigError(
                        f"{at}.tag_filter: invalid regular expression {tag_filter!r}: {exc}") from None
            period = parse_duration(entry["period"], f"{at}.period") if "period" in entry else root
            groups = _groups(entry.get("metrics", []), f"{at}.metrics", RUNTIME_GROUPS, period, warnings)
            runtimes.append(RuntimeSelector(tag_filter, groups, pattern))
        system = _groups(data.get("system_metrics", []), "system_metrics", SYSTEM_GROUPS, root, warnings)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return MonitorConfig(tuple(runtimes), system, tuple(f"{source}: {w}" for w in warnings))


def load_config(path: str | Path) -> MonitorConfig:
    """Read and check a config file; every failure is a one-line ConfigError."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    return parse_config(data, str(path))


__all__ = ["DEFAULT_PERIOD_S", "LEGACY_NAMES", "RUNTIME_GROUPS", "SYSTEM_GROUPS", "ConfigError", "GroupSpec",
           "MonitorConfig", "RuntimeSelector", "default_config", "load_config", "parse_config",
           "parse_duration"]
