"""A neuron-monitor report (ours or a real host's) as neuron-top's typed snapshots.

Tolerant by design, since a stream may come from any tools release (sys-tools.md §1.4-§1.9): a group
that is malformed becomes that group's error and the rest of the entry still counts (§1.5 "per-group
independence"); ``null`` lists are empty lists; ``effective_flops`` is read as ``flops``; an entry
with a non-empty ``error`` is kept only to be flagged, never aggregated (what both AWS consumers do).

Hostile by assumption, too (issue 14): every value goes through ``collectors.reportvalues`` here, so
what reaches a snapshot is finite, in range, bounded in count and printable. A bad number makes its
group an error that names it (NaN utilisation, ``1e400`` bytes), a bad pid or ``report`` makes the
entry an error, a hardware count beyond any instance keeps the previous value and says so; the
renderer never sees NaN, an overflow, a lone surrogate or a wrong type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collectors.reportvalues import (
    MAX_APPLICATIONS,
    MAX_CORES,
    MAX_CORES_PER_DEVICE,
    MAX_DEVICES,
    MAX_PID,
    BadValue,
    index,
    integer,
    number,
    sized,
    text,
)
from explorer.top.snapshots import (
    DEVICE_MEMORY_KEYS,
    ERROR,
    HOST_MEMORY_KEYS,
    RUNNING,
    CoreUse,
    Hardware,
    LoadedModel,
    ProcessSnapshot,
    SystemSnapshot,
    TrainingUse,
)

RUNTIME_GROUPS = ("neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats")


class ReportError(ValueError):
    """A line is JSON but not a neuron-monitor report."""


def check_report(report: Any) -> Mapping[str, Any]:
    """The report if it has the shape of one; ReportError saying what is wrong otherwise."""
    if not isinstance(report, Mapping):
        raise ReportError(f"not a JSON object but {type(report).__name__}")
    if "neuron_runtime_data" not in report and "neuron_hardware_info" not in report:
        raise ReportError("no neuron_runtime_data or neuron_hardware_info: not a neuron-monitor report")
    data = report.get("neuron_runtime_data")
    if data is not None and not isinstance(data, list):
        raise ReportError("neuron_runtime_data is not a list")
    if data is not None and len(data) > MAX_APPLICATIONS:
        raise ReportError(f"neuron_runtime_data has {len(data):,} entries (limit {MAX_APPLICATIONS:,})")
    return report


def _hw_count(hw: Mapping[str, Any], key: str, previous: int, hi: int, errors: list[str]) -> int:
    """A hardware count in [0, hi]; the previous value (and a message) when it is missing or bad."""
    if key not in hw or hw[key] is None:
        return previous
    try:
        return integer(hw[key], key, hi=hi)
    except BadValue as exc:
        errors.append(str(exc))
        return previous


def pid_of(entry: Mapping[str, Any]) -> int:
    """An entry's pid, or -1 if it has none that could be a process id."""
    try:
        return integer(entry.get("pid"), "pid", hi=MAX_PID)
    except BadValue:
        return -1


def _amount(value: Any, what: str) -> int:
    """Bytes or a count: a whole number in [0, 2**63), missing or null as 0."""
    return 0 if value is None else integer(value, what)


def _percent(value: Any, what: str) -> float:
    """A utilisation in percent: finite and not negative (above 100 is kept; aggregation caps it)."""
    return 0.0 if value is None else number(value, what, lo=0.0, hi=1e6)


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    """An object of bounded size; null or missing is empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadValue(f"{what} is not an object")
    return sized(value, what)


def hardware_problems(report: Mapping[str, Any]) -> list[str]:
    """What is wrong with a report's ``neuron_hardware_info`` (not the tool's own ``error``)."""
    problems: list[str] = []
    parse_hardware(report, None, problems)
    return problems


def parse_hardware(report: Mapping[str, Any], previous: Hardware | None = None,
                   problems: list[str] | None = None) -> Hardware:
    """The instance from ``neuron_hardware_info`` and ``instance_info``; fields a report leaves out
    keep their previous value (very old builds send only the counts)."""
    hw = report.get("neuron_hardware_info") or {}
    info = report.get("instance_info") or {}
    errors: list[str] = [] if problems is None else problems
    if not isinstance(hw, Mapping):
        errors.append("not an object")
        hw = {}
    if not isinstance(info, Mapping):
        info = {}
    prev = previous or Hardware("", "", "", 0, 0, 0)
    count = _hw_count(hw, "neuron_device_count", prev.device_count, MAX_DEVICES, errors)
    per_device = _hw_count(hw, "neuroncore_per_device_count", prev.cores_per_device, MAX_CORES_PER_DEVICE,
                           errors)
    memory = _hw_count(hw, "neuron_device_memory_size", prev.device_memory_bytes, 2**63 - 1, errors)
    own = [text(hw["error"])] if hw.get("error") else []
    return Hardware(
        instance_id=text(info.get("instance_id") or prev.instance_id or ""),
        instance_type=text(info.get("instance_type") or prev.instance_type or ""),
        core_version=text(hw.get("neuroncore_version") or prev.core_version or "", 16),
        device_count=count,
        cores_per_device=per_device,
        device_memory_bytes=memory,
        simulated=prev.simulated,
        error="; ".join(own + errors),
    )


def parse_system(system_data: Any, previous: SystemSnapshot | None = None) -> SystemSnapshot:
    """``vcpu_usage`` and ``memory_info``; a group absent from this report keeps its last values
    (groups with longer periods are not in every line)."""
    prev = previous or SystemSnapshot()
    if not isinstance(system_data, Mapping):
        return prev
    errors: list[str] = []
    user, system, count = prev.vcpu_user, prev.vcpu_system, prev.vcpu_count
    vcpu = system_data.get("vcpu_usage")
    if vcpu is not None and not isinstance(vcpu, Mapping):
        errors.append("vcpu_usage: not an object")
    elif isinstance(vcpu, Mapping):
        if vcpu.get("error"):
            errors.append(f"vcpu_usage: {text(vcpu['error'])}")
        try:
            avg = _mapping(vcpu["average_usage"], "average_usage")
            share = {k: _percent(avg.get(k, 0), k) for k in ("user", "nice", "system", "io_wait", "irq",
                                                             "soft_irq")}
            usage = vcpu.get("usage_data")
            new_count = len(usage) if isinstance(usage, Mapping) else count
            if new_count is not None and new_count > 1 << 20:
                raise BadValue(f"usage_data has {new_count:,} vCPUs")
            user, count = share["user"] + share["nice"], new_count
            system = sum(share[k] for k in ("system", "io_wait", "irq", "soft_irq"))
        except (KeyError, BadValue) as exc:
            errors.append(f"vcpu_usage: malformed ({text(exc, 120)})")
    mem_total, mem_used = prev.memory_total, prev.memory_used
    swap_total, swap_used = prev.swap_total, prev.swap_used
    mem = system_data.get("memory_info")
    if mem is not None and not isinstance(mem, Mapping):
        errors.append("memory_info: not an object")
    elif isinstance(mem, Mapping):
        if mem.get("error"):
            errors.append(f"memory_info: {text(mem['error'])}")
        try:
            values = (integer(mem["memory_total_bytes"], "memory_total_bytes"),
                      integer(mem["memory_used_bytes"], "memory_used_bytes"),
                      _amount(mem.get("swap_total_bytes", 0), "swap_total_bytes"),
                      _amount(mem.get("swap_used_bytes", 0), "swap_used_bytes"))
            mem_total, mem_used, swap_total, swap_used = values
        except (KeyError, BadValue) as exc:
            errors.append(f"memory_info: malformed ({text(exc, 120)})")
    return SystemSnapshot(user, system, count, mem_total, mem_used, swap_total, swap_used, tuple(errors))


def _cores(group: Mapping[str, Any]) -> dict[int, CoreUse]:
    in_use = _mapping(group.get("neuroncores_in_use"), "neuroncores_in_use")
    out = {}
    for key, value in in_use.items():
        core = index(key, "core", MAX_CORES)
        value = _mapping(value, f"core {core}")
        flops = value.get("flops", value.get("effective_flops", 0))
        utilization = _percent(value.get("neuroncore_utilization", 0), f"core {core} utilization")
        out[core] = CoreUse(core, utilization, number(flops or 0, f"core {core} flops", lo=0.0, hi=1e30))
    return out


def _memory(group: Mapping[str, Any], pid: int, cores_per_device: int) -> tuple[
        dict[str, int], dict[int, dict[str, int]], tuple[LoadedModel, ...]]:
    used = _mapping(group.get("neuron_runtime_used_bytes"), "neuron_runtime_used_bytes")
    breakdown = _mapping(used.get("usage_breakdown"), "usage_breakdown")
    host_raw = _mapping(breakdown.get("host"), "host")
    host = {k: _amount(host_raw.get(k, 0), f"host {k}") for k in HOST_MEMORY_KEYS}
    per_core = {}
    for key, cats in _mapping(breakdown.get("neuroncore_memory_usage"), "neuroncore_memory_usage").items():
        core = index(key, "core", MAX_CORES)
        cats = _mapping(cats, f"core {core} memory")
        per_core[core] = {k: _amount(cats.get(k, 0), f"core {core} {k}") for k in DEVICE_MEMORY_KEYS}
    models = []
    loaded = group.get("loaded_models") or []
    if not isinstance(loaded, list):
        raise BadValue("loaded_models is not a list")
    for model in sized(loaded, "loaded_models"):
        model = _mapping(model, "a loaded model")
        for sg in _mapping(model.get("subgraphs"), "subgraphs").values():
            sg = _mapping(sg, "a subgraph")
            mem = _mapping(sg.get("memory_used_bytes"), "memory_used_bytes")
            split = _mapping(mem.get("usage_breakdown"), "usage_breakdown")
            device_raw = _mapping(split.get("neuron_device"), "neuron_device")
            device_idx = _amount(sg.get("neuron_device_index", sg.get("device", 0)), "neuron_device_index")
            local = _amount(sg.get("neuroncore_index", 0), "neuroncore_index")
            core = device_idx * cores_per_device + local
            if device_idx >= MAX_DEVICES or local >= MAX_CORES_PER_DEVICE or core >= MAX_CORES:
                raise BadValue(f"model core {device_idx}:{local} is beyond any instance")
            models.append(LoadedModel(
                pid=pid, name=text(model.get("name", "")),
                model_id=_amount(model.get("model_id", 0), "model_id"),
                uuid=text(model.get("uuid", ""), 64), is_running=bool(model.get("is_running", True)),
                core=core,
                device_memory={text(k, 64): _amount(v, f"model {k}") for k, v in device_raw.items()},
                host_bytes=_amount(mem.get("host", 0), "model host bytes")))
    return host, per_core, tuple(models)


def _p50(stats: Mapping[str, Any]) -> float | None:
    total = _mapping(stats.get("latency_stats"), "latency_stats").get("total_latency")
    if not isinstance(total, Mapping) or total.get("p50") is None:
        return None
    return number(total["p50"], "latency p50", lo=0.0, hi=1e9)


def _training(stats: Mapping[str, Any]) -> TrainingUse | None:
    raw = stats.get("training_stats")
    if raw is None:
        return None
    t = _mapping(raw, "training_stats")
    lat = t.get("step_latency")
    lat = lat if isinstance(lat, Mapping) else {}
    mfu = t.get("mfu")
    throughput = _mapping(t.get("throughput", {}), "throughput")
    return TrainingUse(
        layout=text(t.get("layout", ""), 120), steps=_amount(t.get("steps", 0), "steps"),
        seq_per_s=number(throughput.get("sequences_per_s", 0.0), "sequences_per_s", lo=0.0, hi=1e15),
        mfu=None if mfu is None else number(mfu, "mfu", lo=0.0, hi=10.0),
        step_p50_s=None if lat.get("p50") is None else number(lat["p50"], "step p50", lo=0.0, hi=1e9),
        step_p99_s=None if lat.get("p99") is None else number(lat["p99"], "step p99", lo=0.0, hi=1e9))


def parse_process(entry: Mapping[str, Any], hardware: Hardware,
                  previous: Mapping[str, Any] | None = None) -> ProcessSnapshot:
    """One ``neuron_runtime_data`` entry; ``previous`` holds this pid's last groups, used for groups
    this report does not carry (each group is refreshed on its own period)."""
    pid = pid_of(entry)
    tag = text(entry.get("neuron_runtime_tag") or pid)
    error = text(entry.get("error") or "")
    if pid < 0 and not error:
        error = f"pid {text(entry.get('pid'), 40)} is not a process id"
    if error:
        return ProcessSnapshot(pid=pid, tag=tag, error=error, state=ERROR)
    report = entry.get("report") or {}
    if not isinstance(report, Mapping):
        return ProcessSnapshot(pid=pid, tag=tag, error="report is not an object", state=ERROR)
    groups = {**(previous or {}), **{k: v for k, v in report.items() if k in RUNTIME_GROUPS}}
    group_errors: dict[str, str] = {}
    fields: dict[str, Any] = {}
    for name in RUNTIME_GROUPS:
        group = groups.get(name)
        if group is None:
            continue
        if not isinstance(group, Mapping):
            group_errors[name] = "not an object"
            continue
        if group.get("error"):
            group_errors[name] = text(group["error"])  # its numbers are not to be trusted (§1.5)
            continue
        try:
            if name == "neuroncore_counters":
                fields["cores"] = _cores(group)
            elif name == "memory_used":
                host, per_core, models = _memory(group, pid, max(hardware.cores_per_device, 1))
                fields.update(host_memory=host, core_memory=per_core, models=models)
            elif name == "neuron_runtime_vcpu_usage":
                usage = _mapping(group["vcpu_usage"], "vcpu_usage")
                fields.update(vcpu_user=_percent(usage.get("user", 0), "vcpu user"),
                              vcpu_system=_percent(usage.get("system", 0), "vcpu system"))
            else:
                summary = _mapping(group.get("execution_summary"), "execution_summary")
                fields.update(executions=_amount(summary.get("completed", 0), "completed"),
                              latency_p50_s=_p50(group), training=_training(group))
        except KeyError as exc:
            group_errors[name] = f"malformed (missing {text(exc, 60)})"
        except BadValue as exc:
            group_errors[name] = f"malformed ({text(exc, 160)})"
        except (TypeError, AttributeError) as exc:  # a shape no check above foresaw: still only this group
            group_errors[name] = f"malformed ({type(exc).__name__}: {text(exc, 120)})"
    return ProcessSnapshot(pid=pid, tag=tag, group_errors=group_errors, state=RUNNING, **fields)


def runtime_groups(entry: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """This pid's latest object of every runtime group (for the next report's ``previous``)."""
    report = entry.get("report")
    merged = dict(previous or {})
    if isinstance(report, Mapping):
        merged.update({k: v for k, v in report.items() if k in RUNTIME_GROUPS})
    return merged


__all__ = ["RUNTIME_GROUPS", "ReportError", "check_report", "hardware_problems", "parse_hardware",
           "parse_process", "parse_system", "pid_of", "runtime_groups"]
