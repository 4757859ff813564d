"""``neuron-top --once``: one frame as plain text, for scripts, CI logs and bug reports.

The same drawing functions as the screen, one after another, with everything expanded (no keys to
press) and one device per grid line. Sections are marked with ``== name ==`` so a script can split
them; cores no process lists read ``--``, never ``0.00%``.
"""

from __future__ import annotations

from explorer.top import fmt, memtree, render
from explorer.top.aggregate import tab_data, tabs
from explorer.top.snapshots import ENGINES, Frame

UNUSED = "."  # the unused part of a bar: dim on screen, a different character in plain text


def _section(name: str) -> str:
    return f"== {name} =="


def _engine_table(frame: Frame, width: int) -> list[str]:
    """Per-engine busy % of every core in use, one line each (live state only)."""
    if frame.status.kind != "live":
        return ["per-engine busy time is not in neuron-monitor reports"]
    data = tab_data(frame, None)
    if not data.engine_busy:
        return ["no core in use"]
    hw = frame.hardware
    lines = [f"{'CORE':<12}" + "".join(f"{e:>9}" for e in ENGINES) + f"{'HBM':>12}"]
    for core in sorted(data.engine_busy):
        busy = data.engine_busy[core]
        label = f"ND{hw.device_of(core)} NC{hw.local_of(core)}"
        lines.append(f"{label:<12}" + "".join(f"{fmt.percent(100 * busy.get(e, 0.0)):>9}" for e in ENGINES)
                     + f"{fmt.rate(data.hbm_bytes_per_s.get(core)):>12}")
    return [line[:width] for line in lines]


def frame_text(frame: Frame, *, width: int = 120, version: str | None = None, flops: bool = False) -> str:
    """The whole frame as text lines of at most ``width`` characters."""
    version = version or render.tool_version()
    data = tab_data(frame, None)
    hw = frame.hardware
    out = [render.title(frame.hardware, frame.host_name, version, width).plain.strip(), ""]
    out.append(_section(render.util_header(frame, data, flops)))
    notes = render.util_notes(frame)
    if notes:
        out.append(next((n for n in notes if len(n) <= width), notes[-1]))
    out += render.grid(hw, data, flops, width, hw.device_count + 1, unused=UNUSED).plain.split("\n")
    out.append(_section("vCPU Utilization"))
    out += render.vcpu(frame, data, width, unused=UNUSED).plain.split("\n")
    out.append(_section("Memory Usage Summary"))
    out += render.memory_summary(frame, data, width).plain.split("\n")
    out.append(_section("Memory Usage Details"))
    rows = memtree.build_rows(hw, data)
    state = memtree.toggle_all(rows, memtree.TreeState())  # everything open
    visible = memtree.visible_rows(rows, state)
    if visible:
        out.append(render.tree_header(width).plain)
        out += [render.tree_row(r, state, width, False).plain for r in visible]
    else:
        out.append("no Neuron activity: no process holds device memory")
    out.append(_section("Engines"))
    out += _engine_table(frame, width)
    out.append(_section("Processes"))
    out += render.processes(frame, width, None).plain.split("\n")
    out.append(_section("Tabs"))
    out.append("  ".join(f"[{i + 1}]:{t.label}" for i, t in enumerate(tabs(frame))))
    status = render.status_line(frame, width)
    if status is not None:
        out.append(_section("Status"))
        out.append(status.plain.rstrip())
    return "\n".join(line.rstrip() for line in out) + "\n"


__all__ = ["frame_text"]
