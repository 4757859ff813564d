"""Helpers for the live-state, neuron-monitor and neuron-ls tests.

* ``state_doc``: a live-state file's JSON for any live process, so readers can be tested with exact
  counters and no simulated model;
* ``holder``: a process that only exists (``sleep``), to own such a file;
* ``PUBLISHER``: a script that runs a small compiled model in a loop, publishing for real;
* ``report_problems``: the neuron-monitor report structure of sys-tools.md §1.4-§1.9, as a checker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

PUBLISHER = """
import os, sys, time
import neuroncore as nc
core = int(sys.argv[1]); stop = sys.argv[2]; instance = sys.argv[3] if len(sys.argv) > 3 else "trn1.32xlarge"
b = nc.GraphBuilder("tiny_" + str(core))
x = b.parameter("x", (64, 128), "bf16")
y = b.matmul(x, b.weight("w", (128, 64), "bf16"))
program = nc.compile(b.build([y]), nc.INSTANCE_TYPES[instance].chip.core)
model = nc.Instance(instance).core(core).load(program)
deadline = time.time() + 60
while not os.path.exists(stop) and time.time() < deadline:
    model.execute(timing_only=True)
    time.sleep(0.001)
"""


def live_env(live_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        NEURONSCOPE_LIVE="1",
        NEURONSCOPE_LIVE_DIR=str(live_dir),
        NEURONSCOPE_LIVE_PERIOD="0.1",
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


def start_publisher(
    live_dir: Path, core: int, stop: Path, tag: str | None = None, instance: str = "trn1.32xlarge"
) -> subprocess.Popen:
    extra = {"NEURON_PROCESS_TAG": tag} if tag else {}
    return subprocess.Popen(
        [PYTHON, "-c", PUBLISHER, str(core), str(stop), instance], env=live_env(live_dir, **extra), cwd=REPO
    )


def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out waiting for a condition")


def holder() -> subprocess.Popen:
    """A live process whose pid can own a hand-written state file."""
    return subprocess.Popen(["sleep", "60"])


def state_doc(
    pid: int,
    *,
    tag: str | None = None,
    sampled_at: float | None = None,
    sequence: int = 1,
    cores: dict[int, dict[str, Any]] | None = None,
    models: list[dict[str, Any]] | None = None,
    completed: int = 0,
    total_hist: dict[int, int] | None = None,
    device_hist: dict[int, int] | None = None,
    started_at: float | None = None,
    cpu_user_s: float = 0.0,
    rss: int = 1 << 20,
    period_s: float = 0.5,
    instance_type: str = "trn1.32xlarge",
    start_time: float | None = None,
    command: str = "python serve.py --model bert",
) -> dict[str, Any]:
    now = time.time()
    statuses = (
        "completed",
        "completed_with_err",
        "completed_with_num_err",
        "timed_out",
        "incorrect_input",
        "failed_to_queue",
    )
    return {
        "format": "neuronscope-live",
        "version": 1,
        "pid": pid,
        "start_time": psutil.Process(pid).create_time() if start_time is None else start_time,
        "tag": tag or str(pid),
        "command": command,
        "user": "tester",
        "runtime_version": "0.1.0",
        "period_s": period_s,
        "started_at": now - 10 if started_at is None else started_at,
        "sampled_at": now if sampled_at is None else sampled_at,
        "sequence": sequence,
        "host": {"cpu_user_s": cpu_user_s, "cpu_system_s": 0.0, "rss_bytes": rss},
        "instance_type": instance_type,
        "cores": {
            str(k): {
                "generation": 2,
                "device": k // 2,
                "busy_ns": 0,
                "flops": 0,
                "executions": 0,
                "hbm_bytes": 0,
                "engine_busy_ns": {},
                "last_execution_at": 0.0,
                **v,
            }
            for k, v in (cores or {}).items()
        },
        "models": models or [],
        "execution_status": {s: (completed if s == "completed" else 0) for s in statuses},
        "errors": dict.fromkeys(("generic", "numerical", "transient", "model", "runtime", "hardware"), 0),
        "total_latency_hist": {str(k): v for k, v in (total_hist or {}).items()},
        "device_latency_hist": {str(k): v for k, v in (device_hist or {}).items()},
        "link_bytes": {},
    }


def model_doc(
    model_id: int,
    core: int,
    *,
    name: str = "bert",
    memory: dict[str, int] | None = None,
    loaded_at: float | None = None,
) -> dict[str, Any]:
    return {
        "model_id": model_id,
        "name": name,
        "uuid": f"{model_id:032x}",
        "core": core,
        "device": core // 2,
        "rank": 0,
        "loaded_at": time.time() if loaded_at is None else loaded_at,
        "memory": memory
        or {
            "constants": 1000,
            "model_code": 64,
            "model_shared_scratchpad": 32,
            "runtime_memory": 0,
            "tensors": 200,
        },
        "executions": 0,
        "last_execution_at": 0.0,
    }


def write_state(live_dir: Path, doc: dict[str, Any]) -> Path:
    live_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # readers refuse a directory open to others
    path = live_dir / f"{doc['pid']}.json"
    tmp = live_dir / f".{doc['pid']}.0.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


# -- the documented report structure ---------------------------------------------------------------

NUM = (int, float)
PCTS = {"p0", "p1", "p25", "p50", "p75", "p99", "p100"}


def _envelope(group: Any, where: str, problems: list[str]) -> bool:
    if not isinstance(group, dict):
        problems.append(f"{where}: not an object")
        return False
    if not isinstance(group.get("period"), NUM) or isinstance(group.get("period"), bool):
        problems.append(f"{where}.period: not a number")
    if not isinstance(group.get("error"), str):
        problems.append(f"{where}.error: not a string")
    return True


def _keys(obj: Any, keys: set[str], where: str, problems: list[str], kind: type | tuple = NUM) -> None:
    if not isinstance(obj, dict):
        problems.append(f"{where}: not an object")
        return
    if set(obj) != keys:
        problems.append(f"{where}: keys {sorted(obj)} != {sorted(keys)}")
    for key, value in obj.items():
        if not isinstance(value, kind) or isinstance(value, bool):
            problems.append(f"{where}.{key}: wrong type {type(value).__name__}")


MEM = {"constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors"}
HOST = {"application_memory", "constants", "dma_buffers", "tensors"}


def _runtime_groups(report: dict[str, Any], where: str, problems: list[str]) -> None:
    for name, group in report.items():
        at = f"{where}.{name}"
        if not _envelope(group, at, problems):
            continue
        if name == "neuroncore_counters":
            for nc, c in group["neuroncores_in_use"].items():
                if not nc.isdigit():
                    problems.append(f"{at}: core key {nc!r}")
                if not isinstance(c.get("neuroncore_utilization"), NUM) or not isinstance(
                    c.get("flops"), int
                ):
                    problems.append(f"{at}.{nc}: utilization/flops types")
                elif not 0 <= c["neuroncore_utilization"] <= 100:
                    problems.append(f"{at}.{nc}: utilization out of range")
        elif name == "execution_stats":
            _keys(
                group["error_summary"],
                {"generic", "numerical", "transient", "model", "runtime", "hardware"},
                f"{at}.error_summary",
                problems,
                int,
            )
            _keys(
                group["execution_summary"],
                {
                    "completed",
                    "completed_with_err",
                    "completed_with_num_err",
                    "timed_out",
                    "incorrect_input",
                    "failed_to_queue",
                },
                f"{at}.execution_summary",
                problems,
                int,
            )
            for kind in ("total_latency", "device_latency"):
                value = group["latency_stats"][kind]
                if value is not None:
                    _keys(value, PCTS, f"{at}.latency_stats.{kind}", problems)
        elif name == "memory_used":
            used = group["neuron_runtime_used_bytes"]
            breakdown = used["usage_breakdown"]
            _keys(breakdown["host"], HOST, f"{at}.host", problems, int)
            for nc, cats in breakdown["neuroncore_memory_usage"].items():
                _keys(cats, MEM, f"{at}.neuroncore_memory_usage.{nc}", problems, int)
            if used["host"] != sum(breakdown["host"].values()):
                problems.append(f"{at}: host total != sum of categories")
            device_sum = sum(sum(c.values()) for c in breakdown["neuroncore_memory_usage"].values())
            if used["neuron_device"] != device_sum:
                problems.append(f"{at}: neuron_device total != sum of categories")
            for model in group["loaded_models"]:
                if not (
                    isinstance(model["name"], str)
                    and isinstance(model["model_id"], int)
                    and isinstance(model["is_running"], bool)
                    and len(model["uuid"]) == 32
                ):
                    problems.append(f"{at}: loaded model fields")
                for sg in model["subgraphs"].values():
                    mem = sg["memory_used_bytes"]
                    _keys(mem["usage_breakdown"]["host"], HOST, f"{at}.model.host", problems, int)
                    _keys(
                        mem["usage_breakdown"]["neuron_device"],
                        MEM - {"model_shared_scratchpad"},
                        f"{at}.model.neuron_device",
                        problems,
                        int,
                    )
                    if not isinstance(sg["neuroncore_index"], int) or not isinstance(
                        sg["neuron_device_index"], int
                    ):
                        problems.append(f"{at}: subgraph indices")
        elif name == "neuron_runtime_vcpu_usage":
            _keys(group["vcpu_usage"], {"user", "system"}, f"{at}.vcpu_usage", problems)
        else:
            problems.append(f"{at}: unknown runtime group")


def report_problems(report: Any) -> list[str]:
    """Everything in ``report`` that departs from the documented structure (empty: conforms)."""
    problems: list[str] = []
    if not isinstance(report, dict):
        return ["report is not an object"]
    required = {"neuron_runtime_data", "system_data", "instance_info", "neuron_hardware_info"}
    if not required <= set(report) or set(report) - required - {"neuron_k8s_info"}:
        problems.append(f"top-level keys {sorted(report)}")
        return problems
    for i, entry in enumerate(report["neuron_runtime_data"] or []):
        where = f"neuron_runtime_data[{i}]"
        if set(entry) - {"address"} != {"pid", "neuron_runtime_tag", "error", "report"}:
            problems.append(f"{where}: keys {sorted(entry)}")
            continue
        if not isinstance(entry["pid"], int) or not isinstance(entry["neuron_runtime_tag"], str):
            problems.append(f"{where}: pid/tag types")
        _runtime_groups(entry["report"], where, problems)
    for name, group in (report["system_data"] or {}).items():
        at = f"system_data.{name}"
        if not _envelope(group, at, problems):
            continue
        if name == "vcpu_usage":
            keys = {"user", "nice", "system", "idle", "io_wait", "irq", "soft_irq"}
            _keys(group["average_usage"], keys, f"{at}.average_usage", problems)
            for cpu, usage in group["usage_data"].items():
                _keys(usage, keys, f"{at}.usage_data.{cpu}", problems)
            if not isinstance(group["context_switch_count"], int):
                problems.append(f"{at}.context_switch_count: not an int")
        elif name == "memory_info":
            _keys(
                {k: v for k, v in group.items() if k not in ("period", "error")},
                {"memory_total_bytes", "memory_used_bytes", "swap_total_bytes", "swap_used_bytes"},
                at,
                problems,
                int,
            )
        elif name == "neuron_hw_counters":
            for device in group["neuron_devices"] or []:
                _keys(
                    device,
                    {
                        "neuron_device_index",
                        "mem_ecc_corrected",
                        "mem_ecc_uncorrected",
                        "sram_ecc_uncorrected",
                        "sram_ecc_corrected",
                    },
                    f"{at}.device",
                    problems,
                    int,
                )
        else:
            problems.append(f"{at}: unknown system group")
    info = report["instance_info"]
    for key in ("instance_id", "instance_type", "instance_availability_zone", "ami_id", "subnet_id", "error"):
        if not isinstance(info.get(key), str):
            problems.append(f"instance_info.{key}: missing or not a string")
    hw = report["neuron_hardware_info"]
    for key, kind in (
        ("neuron_device_type", str),
        ("neuron_device_version", str),
        ("neuroncore_version", str),
        ("neuron_device_count", int),
        ("neuron_device_memory_size", int),
        ("neuroncore_per_device_count", int),
        ("logical_neuroncore_config", int),
        ("error", str),
    ):
        if not isinstance(hw.get(key), kind):
            problems.append(f"neuron_hardware_info.{key}: missing or not {kind.__name__}")
    return problems


def example_report() -> dict[str, Any]:
    """The §1.11 example report of sys-tools.md (two applications on a trn1.32xlarge-like host, one of
    them with a failing vcpu group), kept as a fixture so the tests do not need ../shared."""
    return json.loads((Path(__file__).parent / "data" / "monitor_example_trn1.json").read_text())
