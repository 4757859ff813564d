"""A neuron-monitor report (ours or a real host's) as neuron-top's typed snapshots.

Tolerant by design, since a stream may come from any tools release (sys-tools.md §1.4-§1.9): a group
that is malformed becomes that group's error and the rest of the entry still counts (§1.5 "per-group
independence"); ``null`` lists are empty lists; ``effective_flops`` is read as ``flops``; an entry
with a non-empty ``error`` is kept only to be flagged, never aggregated (what both AWS consumers do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from explorer.top.model import (
    DEVICE_MEMORY_KEYS,
    ERROR,
    HOST_MEMORY_KEYS,
    RUNNING,
    CoreUse,
    Hardware,
    LoadedModel,
    ProcessSnapshot,
    SystemSnapshot,
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
    return report


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_hardware(report: Mapping[str, Any], previous: Hardware | None = None) -> Hardware:
    """The instance from ``neuron_hardware_info`` and ``instance_info``; fields a report leaves out
    keep their previous value (very old builds send only the counts)."""
    hw = report.get("neuron_hardware_info") or {}
    info = report.get("instance_info") or {}
    if not isinstance(hw, Mapping):
        hw = {}
    if not isinstance(info, Mapping):
        info = {}
    prev = previous or Hardware("", "", "", 0, 0, 0)
    return Hardware(
        instance_id=str(info.get("instance_id") or prev.instance_id or ""),
        instance_type=str(info.get("instance_type") or prev.instance_type or ""),
        core_version=str(hw.get("neuroncore_version") or prev.core_version or ""),
        device_count=_int(hw.get("neuron_device_count"), prev.device_count),
        cores_per_device=_int(hw.get("neuroncore_per_device_count"), prev.cores_per_device),
        device_memory_bytes=_int(hw.get("neuron_device_memory_size"), prev.device_memory_bytes),
        simulated=prev.simulated,
        error=str(hw.get("error") or ""),
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
    if isinstance(vcpu, Mapping):
        if vcpu.get("error"):
            errors.append(f"vcpu_usage: {vcpu['error']}")
        try:
            avg = vcpu["average_usage"]
            user = float(avg.get("user", 0)) + float(avg.get("nice", 0))
            system = sum(float(avg.get(k, 0)) for k in ("system", "io_wait", "irq", "soft_irq"))
            usage = vcpu.get("usage_data")
            count = len(usage) if isinstance(usage, Mapping) else count
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            errors.append(f"vcpu_usage: malformed ({exc})")
    mem_total, mem_used = prev.memory_total, prev.memory_used
    swap_total, swap_used = prev.swap_total, prev.swap_used
    mem = system_data.get("memory_info")
    if isinstance(mem, Mapping):
        if mem.get("error"):
            errors.append(f"memory_info: {mem['error']}")
        try:
            mem_total, mem_used = int(mem["memory_total_bytes"]), int(mem["memory_used_bytes"])
            swap_total, swap_used = int(mem.get("swap_total_bytes", 0)), int(mem.get("swap_used_bytes", 0))
        except (KeyError, TypeError, ValueError) as exc:
            errors.append(f"memory_info: malformed ({exc})")
    return SystemSnapshot(user, system, count, mem_total, mem_used, swap_total, swap_used, tuple(errors))


def _cores(group: Mapping[str, Any]) -> dict[int, CoreUse]:
    in_use = group.get("neuroncores_in_use") or {}
    out = {}
    for key, value in in_use.items():
        core = int(key)
        flops = value.get("flops", value.get("effective_flops", 0)) or 0
        out[core] = CoreUse(core, float(value.get("neuroncore_utilization", 0) or 0), float(flops))
    return out


def _memory(group: Mapping[str, Any], pid: int, cores_per_device: int) -> tuple[
        dict[str, int], dict[int, dict[str, int]], tuple[LoadedModel, ...]]:
    used = group.get("neuron_runtime_used_bytes") or {}
    breakdown = used.get("usage_breakdown") or {}
    host_raw = breakdown.get("host") or {}
    host = {k: int(host_raw.get(k, 0) or 0) for k in HOST_MEMORY_KEYS}
    per_core = {}
    for key, cats in (breakdown.get("neuroncore_memory_usage") or {}).items():
        per_core[int(key)] = {k: int(cats.get(k, 0) or 0) for k in DEVICE_MEMORY_KEYS}
    models = []
    for model in group.get("loaded_models") or []:
        for sg in (model.get("subgraphs") or {}).values():
            mem = sg.get("memory_used_bytes") or {}
            split = mem.get("usage_breakdown") or {}
            device_raw = split.get("neuron_device") or {}
            device_idx = int(sg.get("neuron_device_index", sg.get("device", 0)) or 0)
            local = int(sg.get("neuroncore_index", 0) or 0)
            models.append(LoadedModel(
                pid=pid, name=str(model.get("name", "")), model_id=int(model.get("model_id", 0) or 0),
                uuid=str(model.get("uuid", "")), is_running=bool(model.get("is_running", True)),
                core=device_idx * cores_per_device + local,
                device_memory={k: int(v or 0) for k, v in device_raw.items()},
                host_bytes=int(mem.get("host", 0) or 0)))
    return host, per_core, tuple(models)


def _p50(stats: Mapping[str, Any]) -> float | None:
    total = (stats.get("latency_stats") or {}).get("total_latency")
    if not isinstance(total, Mapping) or total.get("p50") is None:
        return None
    return float(total["p50"])


def parse_process(entry: Mapping[str, Any], hardware: Hardware,
                  previous: Mapping[str, Any] | None = None) -> ProcessSnapshot:
    """One ``neuron_runtime_data`` entry; ``previous`` holds this pid's last groups, used for groups
    this report does not carry (each group is refreshed on its own period)."""
    pid = _int(entry.get("pid"), -1)
    tag = str(entry.get("neuron_runtime_tag") or pid)
    error = str(entry.get("error") or "")
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
            group_errors[name] = str(group["error"])  # its numbers are not to be trusted (§1.5)
            continue
        try:
            if name == "neuroncore_counters":
                fields["cores"] = _cores(group)
            elif name == "memory_used":
                host, per_core, models = _memory(group, pid, max(hardware.cores_per_device, 1))
                fields.update(host_memory=host, core_memory=per_core, models=models)
            elif name == "neuron_runtime_vcpu_usage":
                usage = group["vcpu_usage"]
                fields.update(vcpu_user=float(usage.get("user", 0)),
                              vcpu_system=float(usage.get("system", 0)))
            else:
                summary = group.get("execution_summary") or {}
                fields.update(executions=int(summary.get("completed", 0) or 0), latency_p50_s=_p50(group))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            group_errors[name] = f"malformed ({type(exc).__name__}: {exc})"
    return ProcessSnapshot(pid=pid, tag=tag, group_errors=group_errors, state=RUNNING, **fields)


def runtime_groups(entry: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """This pid's latest object of every runtime group (for the next report's ``previous``)."""
    report = entry.get("report")
    merged = dict(previous or {})
    if isinstance(report, Mapping):
        merged.update({k: v for k, v in report.items() if k in RUNTIME_GROUPS})
    return merged


__all__ = ["RUNTIME_GROUPS", "ReportError", "check_report", "parse_hardware", "parse_process",
           "parse_system", "runtime_groups"]
