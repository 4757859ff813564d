"""``neuron-monitor-prometheus``: serve a neuron-monitor stream (ours or a real host's) as /metrics.

    neuron-monitor | neuron-monitor-prometheus --port 8000
    ssh trn-host neuron-monitor | neuron-monitor-prometheus --bind 0.0.0.0

Metric names, HELP texts, labels, value derivations and update rules are the AWS companion
script's (sys-tools.md §2): ratios are ``value / 100.0``; counters add each report's per-period
deltas; series are keyed by ``runtime_tag``; a report with no applications clears every labelled
series; ``instance_info`` and ``neuron_hardware_info`` come from the first report only. The default
registry is used, so the process and Python collectors are exported as theirs are.

Differences, all deliberate: binds 127.0.0.1 unless ``--bind`` says otherwise (the script listens
on every interface); a malformed line or group is skipped, said on stderr and counted in
``neuronscope_exporter_malformed_lines_total`` (a distinct prefix, so dashboards are not disturbed),
where the script can die on some shapes (``neuron_devices: null``); ``--linger`` keeps serving after
the input ends. Port 0 picks a free port; the start-up line says which.

Bad input never reaches a metric (issue 14; rules in ``collectors.reportvalues``): NaN, ±Inf and
numbers beyond int64 are refused (a NaN counter would stay NaN forever), label values lose lone
surrogates and control characters (one such tag made every later scrape fail), core and device
indices are bounded, and over-long, too deeply nested or otherwise undecodable lines are skipped,
said and counted like any other malformed line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Info, start_http_server

from collectors.reportvalues import (
    MAX_CORES,
    MAX_DEVICES,
    MAX_INT,
    TOO_LONG,
    BadValue,
    index,
    integer,
    loads,
    number,
    read_bounded_line,
    text,
)
from neuronscope.cli_kit import OneLineParser

INSTANCE_LABELS = (("instance_name", "instance_name"), ("instance_id", "instance_id"),
                   ("instance_type", "instance_type"), ("availability_zone", "instance_availability_zone"),
                   ("region", "instance_region"), ("subnet_id", "subnet_id"))
MEMORY_CATEGORIES = ("constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors")
ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")
STATUS_TYPES = ("completed", "completed_with_err", "completed_with_num_err", "timed_out", "incorrect_input",
                "failed_to_queue")
PERCENTILES = ("p0", "p1", "p25", "p50", "p75", "p99", "p100")
ECC_TYPES = ("mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected")


class MalformedReport(ValueError):
    """Part of a report does not have the documented shape."""


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedReport(f"{what} is not an object")
    return value


def _num(value: Any, what: str) -> float:
    """A finite number within int64's range (NaN, ±Inf and 1e400 are refused, never exported)."""
    try:
        return number(value, what)
    except BadValue as exc:
        raise MalformedReport(str(exc)) from None


class Exporter:
    """Turns reports into prometheus_client metrics, exactly as the AWS script does."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, err: TextIO | None = None) -> None:
        self.registry = registry
        self.err = err or sys.stderr
        self.metrics: dict[str, Gauge | Counter] = {}
        self.instance_labels: dict[str, str] | None = None
        self._infos_done = False
        self.lines = 0
        self.malformed = 0
        self._lock = threading.Lock()
        self.malformed_counter = Counter(
            "neuronscope_exporter_malformed_lines", "Input lines skipped in whole or part (not valid "
            "neuron-monitor JSON)", registry=registry)

    # -- metric helpers ----------------------------------------------------------------------

    def _labels(self, **extra: str) -> dict[str, str]:
        return {**(self.instance_labels or {}), **{k: text(v) for k, v in extra.items()}}

    def _metric(self, kind: type, name: str, help_text: str, extra: Sequence[str]) -> Any:
        metric = self.metrics.get(name)
        if metric is None:
            names = [*(self.instance_labels or {}), *extra]
            metric = kind(name, help_text, names, registry=self.registry)
            self.metrics[name] = metric
        return metric

    def _gauge(self, name: str, help_text: str, value: float, **labels: str) -> None:
        self._metric(Gauge, name, help_text, list(labels)).labels(**self._labels(**labels)).set(value)

    def _counter(self, name: str, help_text: str, value: float, **labels: str) -> None:
        if not 0 <= value <= MAX_INT:  # _num already refused NaN and ±Inf
            raise MalformedReport(f"{name}: count {value:g} is out of range")
        self._metric(Counter, name, help_text, list(labels)).labels(**self._labels(**labels)).inc(value)

    def clear(self) -> None:
        """Forget every labelled series (no application is running any more)."""
        for metric in self.metrics.values():
            metric.clear()

    # -- input -------------------------------------------------------------------------------

    def process_line(self, line: str) -> bool:
        """Use one input line; False (said on stderr, counted) if it was malformed in any part."""
        if line == TOO_LONG:
            self.lines += 1
            self._skip(f"line {self.lines}: too long, skipped")
            return False
        if not line.strip():
            return True
        self.lines += 1
        try:
            report = loads(line)
        except BadValue as exc:
            self._skip(f"Unable to decode JSON (line {self.lines}): {exc}")
            return False
        if not isinstance(report, dict):
            self._skip(f"line {self.lines}: not a neuron-monitor report (a JSON {type(report).__name__})")
            return False
        with self._lock:
            problems = self.process_report(report)
        for problem in problems:
            print(f"line {self.lines}: {problem}", file=self.err)
        if problems:
            self._count()
        return not problems

    def _skip(self, message: str) -> None:
        print(message, file=self.err)
        self._count()

    def _count(self) -> None:
        self.malformed += 1
        self.malformed_counter.inc()

    def process_report(self, report: dict[str, Any]) -> list[str]:
        """Apply one report; returns the problems met (each skipped part is said once)."""
        problems: list[str] = []
        if self.instance_labels is None:
            info = report.get("instance_info")
            info = info if isinstance(info, dict) else {}
            self.instance_labels = {label: text(info.get(key) or "") for label, key in INSTANCE_LABELS}
        runtimes = report.get("neuron_runtime_data")
        if runtimes:
            if not isinstance(runtimes, list):
                problems.append("neuron_runtime_data is not a list")
            else:
                for entry in runtimes:
                    problems += self._runtime(entry)
        else:
            self.clear()
        system = report.get("system_data")
        if system is not None:
            if not isinstance(system, dict):
                problems.append("system_data is not an object")
            else:
                for group, handler in (("neuron_hw_counters", self._hw_counters), ("vcpu_usage", self._vcpu),
                                       ("memory_info", self._memory_info)):
                    if group in system:
                        problems += self._group(group, system[group], handler, None)
        self._infos(report)
        return problems

    def _group(self, name: str, data: Any, handler: Any, tag: str | None) -> list[str]:
        if not isinstance(data, dict):
            return [f"{name} is not an object"]
        error = data.get("error", "")
        if error:
            where = f" for runtime tag {tag}" if tag is not None else ""
            print(f"Error getting {name}{where}: {text(error)}", file=self.err)
            return []
        try:
            if tag is None:
                handler(data)
            else:
                handler(data, tag)
        except (MalformedReport, TypeError, ValueError, AttributeError) as exc:
            return [f"{name}: {text(exc, 200)}"]
        return []

    def _runtime(self, entry: Any) -> list[str]:
        if not isinstance(entry, dict):
            return ["a neuron_runtime_data entry is not an object"]
        tag = text(entry.get("neuron_runtime_tag", entry.get("pid", "")))
        if entry.get("error"):
            print(f"Runtime {tag} error: {text(entry['error'])}", file=self.err)
            return []
        report = entry.get("report")
        if not isinstance(report, dict):
            return [f"runtime {tag}: report is not an object"]
        handlers = {"neuroncore_counters": self._neuroncore_counters,
                    "execution_stats": self._execution_stats, "memory_used": self._memory_used,
                    "neuron_runtime_vcpu_usage": self._runtime_vcpu}
        problems = []
        for group, data in report.items():  # groups in the order the report lists them
            handler = handlers.get(group)
            if handler is not None:
                problems += self._group(group, data, handler, tag)
        return problems

    # -- runtime groups ----------------------------------------------------------------------

    def _neuroncore_counters(self, data: dict[str, Any], tag: str) -> None:
        for nc, counters in _obj(data.get("neuroncores_in_use") or {}, "neuroncores_in_use").items():
            counters = _obj(counters, f"core {nc}")
            value = _num(counters.get("neuroncore_utilization"), "neuroncore_utilization")
            self._gauge("neuroncore_utilization_ratio", "NeuronCore utilization ratio", value / 100.0,
                        runtime_tag=tag, neuroncore=str(index(nc, "neuroncore", MAX_CORES)))

    def _runtime_vcpu(self, data: dict[str, Any], tag: str) -> None:
        usage = _obj(data.get("vcpu_usage"), "vcpu_usage")
        for kind in ("user", "system"):
            self._gauge("neuron_runtime_vcpu_usage_ratio", "Runtime vCPU utilization ratio",
                        _num(usage.get(kind), kind) / 100.0, runtime_tag=tag, usage_type=kind)

    def _memory_used(self, data: dict[str, Any], tag: str) -> None:
        used = _obj(data.get("neuron_runtime_used_bytes"), "neuron_runtime_used_bytes")
        for location in ("host", "neuron_device"):
            self._gauge("neuron_runtime_memory_used_bytes", "Runtime memory used bytes",
                        _num(used.get(location), location), runtime_tag=tag, memory_location=location)
        breakdown = _obj(used.get("usage_breakdown") or {}, "usage_breakdown")
        for nc, categories in _obj(breakdown.get("neuroncore_memory_usage") or {},
                                   "neuroncore_memory_usage").items():
            categories = _obj(categories, f"core {nc}")
            for category in MEMORY_CATEGORIES:
                if category in categories:
                    self._gauge(f"neuroncore_memory_usage_{category}",
                                f"NeuronCore memory utilization for {category}",
                                _num(categories[category], category), runtime_tag=tag,
                                neuroncore=str(index(nc, "neuroncore", MAX_CORES)), memory_location="None")

    def _execution_stats(self, data: dict[str, Any], tag: str) -> None:
        errors = _obj(data.get("error_summary") or {}, "error_summary")
        for kind in ERROR_TYPES:
            if kind in errors:
                self._counter("execution_errors_total", "Execution errors total",
                              _num(errors[kind], kind), runtime_tag=tag, error_type=kind)
        status = _obj(data.get("execution_summary") or {}, "execution_summary")
        for kind in STATUS_TYPES:
            if kind in status:
                self._counter("execution_status_total", "Execution status total",
                              _num(status[kind], kind), runtime_tag=tag, status_type=kind)
        latency = _obj(data.get("latency_stats") or {}, "latency_stats").get("total_latency")
        if latency is not None:  # null: nothing ran, the gauge keeps its value (as the script)
            latency = _obj(latency, "total_latency")
            for p in PERCENTILES:
                if p in latency:
                    self._gauge("execution_latency_seconds", "Execution latency in seconds",
                                _num(latency[p], p), runtime_tag=tag, percentile=p)

    # -- system groups -----------------------------------------------------------------------

    def _hw_counters(self, data: dict[str, Any]) -> None:
        devices = data.get("neuron_devices")
        if devices is None:
            raise MalformedReport("neuron_devices is null (no driver?)")
        if not isinstance(devices, list):
            raise MalformedReport("neuron_devices is not a list")
        for device in devices:
            device = _obj(device, "neuron_devices[]")
            device_index = str(integer(device.get("neuron_device_index"), "neuron_device_index",
                                       hi=MAX_DEVICES - 1))
            for kind in ECC_TYPES:
                if kind in device:
                    self._counter("hardware_ecc_events_total", "Hardware ecc events total",
                                  _num(device[kind], kind), event_type=kind, neuron_device_index=device_index)

    def _vcpu(self, data: dict[str, Any]) -> None:
        usage = _obj(data.get("usage_data") or {}, "usage_data")
        self._gauge("system_vcpu_count", "System vCPU count", float(len(usage)))
        avg = _obj(data.get("average_usage"), "average_usage")
        values = {k: _num(avg.get(k, 0), k) for k in ("user", "nice", "system", "io_wait", "irq", "soft_irq")}
        self._gauge("system_vcpu_usage_ratio", "System CPU utilization ratio",
                    min(values["user"] + values["nice"], 100) / 100.0, usage_type="user")
        self._gauge("system_vcpu_usage_ratio", "System CPU utilization ratio",
                    min(values["system"] + values["io_wait"] + values["irq"] + values["soft_irq"], 100)
                    / 100.0, usage_type="system")

    def _memory_info(self, data: dict[str, Any]) -> None:
        for kind in ("memory", "swap"):
            for key in ("total_bytes", "used_bytes"):
                field = f"{kind}_{key}"
                if field in data:
                    self._gauge(f"system_{field}", f"System {kind} {key} bytes", _num(data[field], field))

    def _infos(self, report: dict[str, Any]) -> None:
        if self._infos_done:
            return
        self._infos_done = True
        labels = dict(self.instance_labels or {})
        Info("instance", "EC2 instance information", registry=self.registry).info(labels)
        hardware = report.get("neuron_hardware_info")
        if isinstance(hardware, dict):
            Info("neuron_hardware", "Neuron Hardware Information", registry=self.registry).info({
                "neuron_device_count": text(hardware.get("neuron_device_count", ""), 24),
                "neuroncore_per_device_count": text(hardware.get("neuroncore_per_device_count", ""), 24),
                **labels})

    def consume(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.process_line(line)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="neuron-monitor-prometheus",
        description="Read neuron-monitor JSON lines on stdin and serve them as Prometheus /metrics.")
    parser.add_argument("-p", "--port", type=int, default=8000, help="HTTP port (0: any free port)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--cert-file", help="TLS certificate (with --key-file: serve HTTPS)")
    parser.add_argument("--key-file", help="TLS private key")
    parser.add_argument("--linger", action="store_true", help="keep serving after the input ends")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if bool(args.cert_file) != bool(args.key_file):
        print("neuron-monitor-prometheus: --cert-file and --key-file go together", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"neuron-monitor-prometheus: port {args.port} is out of range", file=sys.stderr)
        return 2
    exporter = Exporter()
    if isinstance(sys.stdin, io.TextIOWrapper):  # bytes that are not UTF-8: a bad line, not a crash
        with contextlib.suppress(ValueError):
            sys.stdin.reconfigure(errors="replace")
    try:
        server, _ = start_http_server(args.port, addr=args.bind, certfile=args.cert_file,
                                      keyfile=args.key_file)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        print(f"neuron-monitor-prometheus: cannot listen on {args.bind}:{args.port}: {reason}",
              file=sys.stderr)
        return 1
    scheme = "HTTPS" if args.cert_file else "HTTP"
    print(f"Running {scheme} prometheus server at port {server.server_port}", flush=True)
    try:
        while True:
            line = read_bounded_line(sys.stdin)
            if not line:
                break
            exporter.process_line(line)
        if exporter.malformed:
            print(f"neuron-monitor-prometheus: skipped {exporter.malformed} malformed of {exporter.lines} "
                  "lines", file=sys.stderr)
        if args.linger:
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
