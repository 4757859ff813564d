"""``neuron-ls``: the Neuron devices of this host and the processes using them, as the real tool.

    neuron-ls                      device inventory (layout A), or devices with processes (layout B)
    neuron-ls -w / -a              layout B; -w keeps 80 characters of COMMAND, -a adds non-runtimes
    neuron-ls -t                   short table, then the topology drawing
    neuron-ls --output-format json
    neuron-ls -j                   the pre-2.34 JSON array
    neuron-ls --instance inf2.48xlarge
                                   show that simulated instance (default: real devices from sysfs if
                                   present, else the configured instance)

Tables are drawn with Rich's ASCII2 box, which is the real tool's border style (``+``, ``-``, ``|``,
one space of padding, two-line centred headers, left-aligned cells). Only the header lines and the
table go to stdout; errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from collectors.inventory import Inventory, InventoryError, discover
from explorer import ls_topology
from explorer.ls_model import (
    COMMAND_WIDTH,
    WIDE_COMMAND_WIDTH,
    DeviceRow,
    connected_text,
    core_ids_text,
    device_json,
    gather,
    memory_text,
)
from neuronscope.cli_kit import OneLineParser, Renderers, add_instance_option

INVENTORY_COLUMNS = ("NEURON DEVICE", "NEURON CORES", "NEURON CORE IDS", "NEURON MEMORY",
                     "CONNECTED DEVICES", "PCI BDF", "CPU AFFINITY", "NUMA NODE")
PROCESS_COLUMNS = ("NEURON DEVICE", "NEURON CORES", "NEURON MEMORY", "CONNECTED DEVICES", "PCI BDF", "PID",
                   "COMMAND", "RUNTIME VERSION")
TOPOLOGY_COLUMNS = ("NEURON DEVICE", "NEURON CORES", "NEURON MEMORY", "CONNECTED DEVICES", "PCI BDF")


def _header(name: str) -> Text:
    """Two-line header: the first word, then the rest (blank second line for one word)."""
    first, _, rest = name.partition(" ")
    return Text(f"{first}\n{rest}", justify="center")


def make_table(columns: Sequence[str], groups: Sequence[Sequence[Sequence[str]]]) -> Table:
    """A neuron-ls table; ``groups`` are the rows of each device. Rules separate device groups when
    any device has more than one row (as the documented examples do)."""
    table = Table(box=box.ASCII2, padding=(0, 1), header_style="", show_edge=True, expand=False)
    for name in columns:
        table.add_column(_header(name), justify="left", no_wrap=True)
    ruled = any(len(rows) > 1 for rows in groups)
    for rows in groups:
        for i, row in enumerate(rows):
            table.add_row(*(Text(cell) for cell in row), end_section=ruled and i == len(rows) - 1)
    return table


def inventory_groups(rows: Sequence[DeviceRow]) -> list[list[list[str]]]:
    groups = []
    for r in rows:
        d = r.device
        numa = str(d.numa_node) if d.numa_node is not None else "NA"
        groups.append([[str(d.index), str(d.cores), core_ids_text(d.core_ids), memory_text(d.memory_bytes),
                        connected_text(d.connected), d.pci_bdf or "NA", d.cpu_affinity or "NA", numa]])
    return groups


def process_groups(rows: Sequence[DeviceRow], width: int) -> list[list[list[str]]]:
    groups = []
    for r in rows:
        d = r.device
        device_cells = [str(d.index), str(d.cores), memory_text(d.memory_bytes),
                        connected_text(d.connected), d.short_bdf or "NA"]
        if not r.processes:
            groups.append([[*device_cells, "NA", "NA", "NA"]])
            continue
        lines = []
        for i, p in enumerate(r.processes):
            cells = device_cells if i == 0 else [""] * len(device_cells)
            lines.append([*cells, str(p.pid), p.short_command(width), p.runtime_version or "NA"])
        groups.append(lines)
    return groups


def topology_groups(rows: Sequence[DeviceRow]) -> list[list[list[str]]]:
    return [[[str(r.device.index), str(r.device.cores), memory_text(r.device.memory_bytes),
              connected_text(r.device.connected), r.device.short_bdf or "NA"]] for r in rows]


def header_lines(inventory: Inventory, instance_id: str = "") -> list[str]:
    lines = [f"instance-type: {inventory.instance_type}"]
    if instance_id:
        lines.append(f"instance-id: {instance_id}")
    if inventory.chip.core.generation == 3:
        lines.append(f"logical-neuroncore-config: {inventory.lnc}")
    return lines


RENDERERS: Renderers[Callable[[Inventory, Sequence[DeviceRow], argparse.Namespace, TextIO], None]] = (
    Renderers("neuron-ls"))


@RENDERERS.register("table", "the real tool's tables")
def render_text(inventory: Inventory, rows: Sequence[DeviceRow], args: argparse.Namespace,
                out: TextIO) -> None:
    console = Console(file=out, width=100_000, color_system=None, highlight=False, markup=False,
                      emoji=False, soft_wrap=False)
    for line in header_lines(inventory):
        out.write(line + "\n")
    if args.topology:
        console.print(make_table(TOPOLOGY_COLUMNS, topology_groups(rows)))
        out.write("\n\n" + ls_topology.HEADING + "\n")
        for line in ls_topology.drawing(inventory.topology, len(inventory.devices)):
            out.write(line + "\n")
        return
    width = WIDE_COMMAND_WIDTH if args.wide else COMMAND_WIDTH
    if args.wide or args.show_all_procs or any(r.processes for r in rows):
        console.print(make_table(PROCESS_COLUMNS, process_groups(rows, width)))
    else:
        console.print(make_table(INVENTORY_COLUMNS, inventory_groups(rows)))


@RENDERERS.register("json", "one JSON document")
def render_json(inventory: Inventory, rows: Sequence[DeviceRow], args: argparse.Namespace,
                out: TextIO) -> None:
    width = WIDE_COMMAND_WIDTH if args.wide else COMMAND_WIDTH
    devices = [device_json(r, inventory.lnc, width) for r in rows]
    if args.json_output:  # the pre-2.34 layout: a bare array
        document: object = devices
    else:
        document = {"instance_type": inventory.instance_type, "instance_id": "",
                    "logical_neuroncore_config": inventory.lnc, "neuron_devices": devices}
    out.write(json.dumps(document, indent=4) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="neuron-ls",
                                     description="List Neuron devices and the processes using them.")
    parser.add_argument("-w", "--wide", action="store_true", help="show up to 80 characters of COMMAND")
    parser.add_argument("-a", "--show-all-procs", action="store_true",
                        help="also list processes holding devices that are not Neuron runtimes")
    parser.add_argument("-t", "--topology", action="store_true", help="print the device topology")
    parser.add_argument("-j", "--json-output", action="store_true", help="JSON array (pre-2.34 layout)")
    RENDERERS.add_option(parser, default="table")
    add_instance_option(parser, "simulated instance type to show (default: real devices, else the "
                                "configured instance)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        inventory = discover(args.instance)
    except (InventoryError, ValueError) as exc:
        print(f"neuron-ls: {exc}", file=sys.stderr)
        return 1
    rows = gather(inventory, show_all=args.show_all_procs)
    try:
        render = RENDERERS.get("json" if args.json_output else args.output_format)
        render(inventory, rows, args, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
