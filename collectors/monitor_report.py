"""The runtime-level groups of a neuron-monitor report, built from live state (sys-tools.md §1.6).

Cores: a process's cores are those it has loaded a model on; they are listed (at 0 when idle) and
every other core is absent, never 0 (§1.5). Keys are global *logical* core indices: under LNC=2 on
trn2 a logical core is two physical cores, its utilisation their mean, its FLOP/s their sum, and its
``v3d`` entry gives each physical core (``nc_v3.<physical index>``).

Memory: device memory by category is the sum over the process's loaded models (see
``collectors.livestate.model_memory``); host memory is the process's resident set, all of it
``application_memory`` (the execution core keeps no separate host tensors or DMA buffers).
Model names follow the real ``<runtime version>+<hash>-<name>`` shape.
"""

from __future__ import annotations

from typing import Any

from collectors.inventory import Inventory
from collectors.livereader import ProcessState
from collectors.livewindow import ProcessWindow, TrainingWindow

MEMORY_KEYS = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
MODEL_DEVICE_KEYS = ("constants", "model_code", "runtime_memory", "tensors")  # no scratchpad per model
HOST_KEYS = ("application_memory", "constants", "dma_buffers", "tensors")
RUNNING_WINDOW_S = 10.0  # a model counts as running if it executed this recently, or was just loaded


def envelope(period_s: float, body: dict[str, Any], error: str = "") -> dict[str, Any]:
    return {"period": round(period_s, 9), **body, "error": error}


def neuroncore_counters(state: ProcessState, win: ProcessWindow, inventory: Inventory) -> dict[str, Any]:
    groups: dict[int, list[tuple[int, float, float]]] = {}
    for index, core in win.cores.items():
        generation = state.cores[index].generation if index in state.cores else 0
        logical = inventory.logical_core(index, generation)
        groups.setdefault(logical, []).append((index, core.utilization, core.flops))
    in_use: dict[str, Any] = {}
    for logical in sorted(groups):
        members = sorted(groups[logical])
        entry: dict[str, Any] = {
            "neuroncore_utilization": sum(u for _, u, _ in members) / len(members),
            "flops": round(sum(f for _, _, f in members)),
        }
        if inventory.core_version == "v3d":
            # physical cores of the logical core, including any the process never used (idle: 0)
            first = logical * inventory.lnc
            used = {i: u for i, u, _ in members}
            entry["v3d"] = {f"nc_v3.{p}": {"neuroncore_utilization": used.get(p, 0.0)}
                            for p in range(first, first + inventory.lnc)}
        in_use[str(logical)] = entry
    return {"neuroncores_in_use": in_use}


def execution_stats(win: ProcessWindow) -> dict[str, Any]:
    out: dict[str, Any] = {
        "error_summary": {k: int(v) for k, v in win.errors.items()},
        "execution_summary": {k: int(v) for k, v in win.execution_status.items()},
        "latency_stats": {
            "total_latency": _rounded(win.total_latency),
            "device_latency": _rounded(win.device_latency),
        },
    }
    if win.training is not None:
        out["training_stats"] = training_stats(win.training)
    return out


def training_stats(t: TrainingWindow) -> dict[str, Any]:
    """neuronscope extension of execution_stats for a process running training steps (the real
    neuron-monitor has no such group; readers of the real report ignore the key): the steps that
    ended in the period, their throughput, training MFU and step-latency percentiles (seconds)."""
    return {"layout": t.layout, "steps": t.steps,
            "throughput": {"sequences_per_s": float(f"{t.seq_per_s:.9g}"),
                           "tokens_per_s": float(f"{t.tokens_per_s:.9g}")},
            "mfu": None if t.mfu is None else float(f"{t.mfu:.6g}"),
            "step_latency": _rounded(t.step_latency)}


def _rounded(p: Any) -> dict[str, float] | None:
    return None if p is None else {k: float(f"{v:.9g}") for k, v in p.items()}


def _model_name(state: ProcessState, uuid: str, name: str) -> str:
    return f"{state.runtime_version}+{uuid[:9]}-{name}"


def memory_used(state: ProcessState, inventory: Inventory, now: float) -> dict[str, Any]:
    per_core: dict[int, dict[str, int]] = {}
    for index, core in state.cores.items():
        logical = inventory.logical_core(index, core.generation)
        per_core.setdefault(logical, dict.fromkeys(MEMORY_KEYS, 0))
    models = []
    for model in state.models:
        generation = state.cores[model.core].generation if model.core in state.cores else 0
        logical = inventory.logical_core(model.core, generation)
        bucket = per_core.setdefault(logical, dict.fromkeys(MEMORY_KEYS, 0))
        for key in MEMORY_KEYS:
            bucket[key] += int(model.memory.get(key, 0))
        device_part = {k: int(model.memory.get(k, 0)) for k in MODEL_DEVICE_KEYS}
        recent = max(model.last_execution_at, model.loaded_at)
        per_device = inventory.cores_per_device if generation == inventory.chip.core.generation else 0
        models.append({
            "name": _model_name(state, model.uuid, model.name),
            "uuid": model.uuid,
            "model_id": model.model_id,
            "is_running": now - recent <= RUNNING_WINDOW_S,
            "subgraphs": {
                "sg_00": {
                    "memory_used_bytes": {
                        "host": 0,
                        "neuron_device": sum(device_part.values()),
                        "usage_breakdown": {
                            "host": dict.fromkeys(HOST_KEYS, 0),
                            "neuron_device": device_part,
                        },
                    },
                    "neuroncore_index": logical % per_device if per_device else logical,
                    "neuron_device_index": logical // per_device if per_device else model.device,
                },
            },
        })
    host = {"application_memory": state.rss_bytes, "constants": 0, "dma_buffers": 0, "tensors": 0}
    return {
        "neuron_runtime_used_bytes": {
            "host": sum(host.values()),
            "neuron_device": sum(sum(v.values()) for v in per_core.values()),
            "usage_breakdown": {
                "host": host,
                "neuroncore_memory_usage": {str(k): per_core[k] for k in sorted(per_core)},
            },
        },
        "loaded_models": models,
    }


def runtime_vcpu_usage(win: ProcessWindow) -> dict[str, Any]:
    return {"vcpu_usage": {"user": round(win.vcpu_user, 2), "system": round(win.vcpu_system, 2)}}


__all__ = ["MEMORY_KEYS", "envelope", "execution_stats", "memory_used", "neuroncore_counters",
           "runtime_vcpu_usage"]
