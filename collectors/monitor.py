"""``neuron-monitor``: one JSON report per line on stdout, in the real tool's schema.

    neuron-monitor                       every group, every application, every 5 s
    neuron-monitor -c monitor.conf       the real configuration format (collectors.monitor_config)
    neuron-monitor --count 1             extension: stop after N reports (scripts, tests)
    neuron-monitor --instance trn1.32xlarge
                                         extension: the simulated instance to report on

Main loop (as the real tool, sys-tools.md §1.1): sleep until a group is due, collect the groups that
are due, write them as one line. Groups with different periods are written only when refreshed, so
a consumer summing deltas never counts a sample twice; every application that matches a
``neuron_runtimes`` entry has an entry in every report (its ``report`` holds only the groups that
were due, possibly none), so ``neuron_runtime_data`` is ``[]`` only when no application runs.

Sources: applications from live state (``collectors.live``), host groups from psutil, hardware
from sysfs on a real host or the simulated instance (``collectors.inventory``). Diagnostics go to
stderr; bad input (config, instance) is one line there and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from collectors import hostmetrics, instanceinfo, livedemand, livepaths, monitor_report
from collectors.inventory import Inventory, InventoryError, discover
from collectors.livereader import ProcessState, read_live_state
from collectors.livewindow import LiveTracker
from collectors.monitor_config import ConfigError, GroupSpec, MonitorConfig, default_config, load_config
from neuronscope.cli_kit import OneLineParser, quiet_stdout

HW_COUNTER_KEYS = ("mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_uncorrected", "sram_ecc_corrected")


@dataclass
class _Scheduled:
    """One group being collected: its period, when it is next due and what it last saw."""

    key: tuple[Any, ...]
    spec: GroupSpec
    next_due: float
    last_time: float
    tracker: LiveTracker = field(default_factory=LiveTracker)
    state: Any = None


class Monitor:
    """Produces reports; time and live state are injectable so tests need not sleep."""

    def __init__(self, config: MonitorConfig, inventory: Inventory, *, live_dir: Path | None = None,
                 clock: Callable[[], float] = time.monotonic, instance_info: dict[str, str] | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.inventory = inventory
        self.live_dir = live_dir
        self.clock = clock
        self.warn = warn or (lambda message: print(message, file=sys.stderr))
        if instance_info is None:
            instance_info = (instanceinfo.imds_info(inventory.instance_type) if inventory.source == "sysfs"
                             else instanceinfo.simulated_info(inventory.instance_type))
        self.instance_info = instance_info
        now = clock()
        states = self.read_states()
        self.groups: list[_Scheduled] = []
        for index, selector in enumerate(config.runtimes):
            for spec in selector.groups:
                group = _Scheduled(("runtime", index, spec.type), spec, now + spec.period_s, now)
                group.tracker.prime(states)
                self.groups.append(group)
        for spec in config.system:
            group = _Scheduled(("system", spec.type), spec, now + spec.period_s, now)
            if spec.type == "vcpu_usage":
                group.state = hostmetrics.CpuSampler()
            elif spec.type == "neuron_hw_counters":
                group.state = self._hw_totals()[0]
            self.groups.append(group)

    def read_states(self) -> list[ProcessState]:
        return read_live_state(self.live_dir)

    def seconds_until_due(self) -> float:
        if not self.groups:
            return float("inf")
        return max(min(g.next_due for g in self.groups) - self.clock(), 0.0)

    # -- one report ----------------------------------------------------------------------------

    def report(self) -> dict[str, Any] | None:
        """Collect the groups that are due; None if none is."""
        now = self.clock()
        due = [g for g in self.groups if g.next_due <= now + 1e-3]
        if not due:
            return None
        for group in due:
            group.next_due += group.spec.period_s
            if group.next_due <= now:  # fell behind (slow host, suspended): do not burst to catch up
                group.next_due = now + group.spec.period_s
        states = self.read_states() if self.config.runtimes else []
        wall = time.time()
        runtime_data = self._runtime_data(states, [g for g in due if g.key[0] == "runtime"], now, wall)
        system = {}
        for group in due:
            if group.key[0] == "system":
                system[group.spec.type] = self._system_group(group, now)
        for group in due:
            group.last_time = now
        return {
            "neuron_runtime_data": runtime_data,
            "system_data": system,
            "instance_info": dict(self.instance_info),
            "neuron_hardware_info": self.inventory.hardware_info(),
        }

    def _runtime_data(self, states: list[ProcessState], due: list[_Scheduled], now: float,
                      wall: float) -> list[dict[str, Any]]:
        by_entry: dict[int, list[ProcessState]] = {}
        for state in states:
            entry = self.config.selector_for(state.tag)
            if entry is not None:
                by_entry.setdefault(entry, []).append(state)
        reports: dict[int, dict[str, Any]] = {}
        for group in due:
            entry = group.key[1]
            members = by_entry.get(entry, [])
            windows = group.tracker.advance(members)
            period = now - group.last_time
            for state in members:
                win = windows[state.pid]
                body = self._runtime_group(group.spec.type, state, win, wall)
                reports.setdefault(state.pid, {})[group.spec.type] = monitor_report.envelope(period, body)
        listed = sorted((s for entry in sorted(by_entry) for s in by_entry[entry]), key=lambda s: s.pid)
        return [{"pid": s.pid, "neuron_runtime_tag": s.tag, "error": "", "report": reports.get(s.pid, {})}
                for s in listed]

    def _runtime_group(self, kind: str, state: ProcessState, win: Any, wall: float) -> dict[str, Any]:
        if kind == "neuroncore_counters":
            return monitor_report.neuroncore_counters(state, win, self.inventory)
        if kind == "execution_stats":
            return monitor_report.execution_stats(win)
        if kind == "memory_used":
            return monitor_report.memory_used(state, self.inventory, wall)
        return monitor_report.runtime_vcpu_usage(win)

    def _system_group(self, group: _Scheduled, now: float) -> dict[str, Any]:
        period = now - group.last_time
        kind = group.spec.type
        try:
            if kind == "vcpu_usage":
                return monitor_report.envelope(period, group.state.sample())
            if kind == "memory_info":
                return monitor_report.envelope(period, hostmetrics.memory_info())
            totals, errors = self._hw_totals()
            devices = []
            for device in self.inventory.devices:
                before = group.state.get(device.index, {})
                after = totals.get(device.index, {})
                devices.append({"neuron_device_index": device.index,
                                **{k: max(after.get(k, 0) - before.get(k, 0), 0) for k in HW_COUNTER_KEYS}})
            group.state = totals
            return monitor_report.envelope(period, {"neuron_devices": devices}, "; ".join(errors))
        except Exception as exc:  # one group failing must not stop the others (§1.5)
            return monitor_report.envelope(period, {}, f"{type(exc).__name__}: {exc}")

    def _hw_totals(self) -> tuple[dict[int, dict[str, int]], list[str]]:
        """Cumulative ECC counters per device and read errors: sysfs totals on a real host; the
        simulated hardware has no ECC faults, so its counters stay at zero."""
        if self.inventory.source != "sysfs":
            return {}, []
        from collectors import sysfs

        totals, errors = {}, []
        for device in self.inventory.sysfs_devices:
            fresh = sysfs.read_device(device.index, device.path)
            totals[device.index] = fresh.hw_counters
            errors += [e for e in fresh.errors if any(k in e for k in sysfs.HW_COUNTERS)]
        return totals, errors

    # -- the loop ------------------------------------------------------------------------------

    def run(self, out: TextIO, count: int | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        written = 0
        while count is None or written < count:
            wait = self.seconds_until_due()
            if wait == float("inf"):  # nothing to collect (parse_config refuses such configs)
                return
            sleep(wait)
            report = self.report()
            if report is None:
                continue
            out.write(json.dumps(report, separators=(",", ":")) + "\n")
            out.flush()
            written += 1


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="neuron-monitor",
        description="Write Neuron runtime and system metrics as one JSON report per line.")
    parser.add_argument("-c", "--config-file", help="JSON configuration file (real neuron-monitor format)")
    parser.add_argument("--verbose", type=int, default=0, choices=range(5), metavar="{0-4}",
                        help="diagnostics on stderr (0: none)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many reports (extension)")
    parser.add_argument("--instance", help="simulated instance type (default: configured; extension)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.count is not None and args.count < 1:
        print("neuron-monitor: --count must be at least 1", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config_file) if args.config_file else default_config()
        inventory = discover(args.instance)
    except (ConfigError, InventoryError) as exc:
        print(f"neuron-monitor: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # unreadable user settings (neuroncore.config)
        print(f"neuron-monitor: {exc}", file=sys.stderr)
        return 2
    try:  # someone else's (or an open) live-state directory is refused, not read
        livepaths.check_live_dir()
    except livepaths.LiveDirError as exc:
        print(f"neuron-monitor: {exc}", file=sys.stderr)
        return 2
    for warning in config.warnings:
        print(f"neuron-monitor: warning: {warning}", file=sys.stderr)
    if args.verbose:
        print(f"neuron-monitor: {inventory.source} {inventory.instance_type}, "
              f"{len(inventory.devices)} devices; {len(config.runtimes)} runtime selectors, "
              f"{len(config.system)} system groups", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    monitor = Monitor(config, inventory)
    if config.runtimes:  # it reports processes: ask them to publish (collectors.livedemand); removed at exit
        livedemand.Watch(monitor.live_dir).start()
    try:
        monitor.run(sys.stdout, args.count)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        quiet_stdout()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
