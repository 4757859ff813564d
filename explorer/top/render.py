"""Every panel of neuron-top as Rich ``Text``, from frames and tab data only.

One set of drawing functions serves the Textual widgets (which add nothing but focus and keys) and
``--once`` (which prints ``Text.plain``), so the plain-text frame a script reads is the screen a
person sees. Each function takes the width it may use and lays itself out for it: bars shrink,
columns drop, devices share grid lines when the height is short; nothing here assumes a terminal
size, so a small terminal degrades instead of breaking.

Layout and wording follow sys-tools.md §3.2; colours §3.6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import metadata

from rich.text import Text

from explorer.top import fmt, names
from explorer.top.aggregate import MAX_NUMBERED_TABS, Tab, TabData, mean_utilization
from explorer.top.memtree import TreeRow, TreeState, is_expanded
from explorer.top.proctable import SortKey, TableView, ordered, utilization
from explorer.top.snapshots import (
    DEVICE_MEMORY_KEYS,
    DEVICE_MEMORY_LABELS,
    ENGINES,
    ERROR,
    EXITED,
    HOST_MEMORY_KEYS,
    HOST_MEMORY_LABELS,
    STALE,
    STOPPED,
    Frame,
    Hardware,
    ProcessSnapshot,
    SourceStatus,
)

S_TITLE = "bold white on blue"
S_SECTION = "black on cyan"
S_USED = "bold green"
S_UNUSED = "grey37"
S_SYS = "bold red"
S_VALUE = "green"
S_DIM = "grey50"
S_HIGHLIGHT = "on blue"
S_SELECTED = "bold yellow on #c86464"
S_BAR = "white on blue"
S_TAB_LABEL = "bold yellow on blue"
S_TAB_SELECTED = "bold green on blue"
S_WARN = "bold yellow"
S_ERROR = "bold red"
S_NOTE = "bold black on cyan"
S_STOPPED = "bold magenta"
S_SORTED = "bold black on cyan"
LABEL_W = 5  # "ND15 "
PCT_W = 8  # "[56.81%]"
TF_W = 11  # "[ 10.004TF]"
NO_DATA_PCT = "[  --  ]"
NO_DATA_TF = "[    --   ]"


def tool_version() -> str:
    try:
        return metadata.version("neuronscope")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def _line(text: Text, width: int) -> Text:
    """One line padded or cropped to exactly ``width`` cells."""
    text = text.copy()
    text.truncate(width, overflow="crop", pad=True)
    return text


def _based(text: Text, style: str) -> Text:
    """``text`` over a base style (its own spans win): bars whose segments keep their colours."""
    text.style = style
    return text


def _join(lines: Sequence[Text]) -> Text:
    out = Text(no_wrap=True, overflow="crop", end="")
    for i, line in enumerate(lines):
        if i:
            out.append("\n")
        out.append_text(line)
    return out


def section(label: str, width: int) -> Text:
    return _line(Text(" " + label, style=S_SECTION), width)


# -- title and grid ----------------------------------------------------------------------------

def title(hw: Hardware, host_name: str, version: str, width: int) -> Text:
    where = hw.instance_id or host_name or "unknown host"
    kind = hw.instance_type or "unknown instance"
    if hw.simulated:
        kind += ", simulated"
    text = Text(f"neuron-top {version} running on {where} ({kind})", style=S_TITLE)
    text.truncate(width, overflow="ellipsis")
    pad = max(width - text.cell_len, 0)
    return _based(_line(Text(" " * (pad // 2)) + text, width), S_TITLE)


def no_activity(frame: Frame) -> bool:
    """Nothing attached at all: not "0 %" but "nobody is using a NeuronCore" (§1.5)."""
    return not frame.active


def util_header(frame: Frame, data: TabData, flops_mode: bool, *, short: bool = False) -> str:
    """``NeuronCore v2 Utilization (Avg: 9.30%, 1 of 32 cores)``: the average is over the cores some
    process lists (``aggregate.mean_utilization``); a core nobody uses reads ``--`` in the grid and
    is not a 0 in the average. ``short`` leaves out the core count (narrow terminals)."""
    hw = frame.hardware
    name = f"NeuronCore {hw.core_version or '?'} Utilization"
    if hw.cores == 0:
        return f"{name} (waiting for hardware information)"
    if no_activity(frame):
        return f"{name} (no Neuron activity)"
    used = len(data.utilization)
    cores = "" if short else f", {used} of {hw.cores} cores"
    if not used:
        return f"{name} (no core in use{'' if short else f' of {hw.cores}'})"
    if flops_mode:
        total = sum(data.flops.values())
        return f"{name} (Avg: {fmt.tflops(total / used)} | Total: {fmt.tflops(total)}{cores})"
    return f"{name} (Avg: {fmt.percent(mean_utilization(data.utilization) or 0.0)}{cores})"


# what the live utilisation means when the cores are simulated, longest first: the screen shows the
# longest that fits beside the header
SIMULATED_NOTES = (
    "simulated: device time per second of this host's clock, so it depends on the host's speed",
    "simulated: depends on how fast this host runs the simulator",
    "simulated: depends on host speed",
    "sim: paced by host CPU",
)


def util_notes(frame: Frame) -> tuple[str, ...]:
    """The caveat of the utilisation figures, as candidates for the header (longest first).

    Live state comes from processes running the simulated core: utilisation is simulated device
    time over the host's wall time (``collectors.livewindow``), so a faster host shows higher figures
    for the same program. A neuron-monitor stream reports what its runtime measured: no caveat."""
    if frame.status.kind != "live" or no_activity(frame):
        return ()
    return SIMULATED_NOTES


def util_section(data: tuple[str, str, tuple[str, ...]], width: int) -> Text:
    """The utilisation section bar: the header, and the longest caveat that fits at the right
    (with the short header if only that leaves room); the caveat is never dropped silently while
    one fits."""
    label, short_label, notes = data
    for head in (label, short_label):
        for note in notes:
            if len(head) + len(note) + 3 <= width:
                text = Text(" " + head, style=S_SECTION)
                text.append(" " * (width - len(head) - len(note) - 2), style=S_SECTION)
                text.append(note + " ", style=S_NOTE)
                return _line(text, width)
    return section(label, width)


def grid_rows_needed(hardware: Hardware, max_rows: int) -> int:
    """Lines the grid uses when it may use ``max_rows`` (header included)."""
    if hardware.device_count == 0:
        return 1
    per_line = devices_per_line(hardware, max_rows)
    return 1 + math.ceil(hardware.device_count / per_line)


def devices_per_line(hardware: Hardware, max_rows: int) -> int:
    return max(1, math.ceil(hardware.device_count / max(max_rows - 1, 1)))


def _cell(value: float | None, flops: float | None, bar_w: int, flops_mode: bool, highlight: bool,
          unused: str) -> Text:
    cell = Text()
    if bar_w > 0:
        if value is None:
            cell.append("·" * bar_w, style=S_UNUSED)
        else:
            used = min(round(value / 100.0 * bar_w), bar_w)
            cell.append("|" * used, style=S_USED)
            cell.append(unused * (bar_w - used), style=S_UNUSED)
    if value is None:
        cell.append(NO_DATA_TF if flops_mode else NO_DATA_PCT, style=S_DIM)
    elif flops_mode:
        cell.append(f"[{fmt.tflops(flops or 0.0, 7)}]")
    else:
        cell.append(f"[{fmt.percent(value)}]")
    if highlight:
        cell.stylize(S_HIGHLIGHT)
    return cell


def grid(hardware: Hardware, data: TabData, flops_mode: bool, width: int, max_rows: int,
         highlight: Sequence[int] = (), unused: str = "|") -> Text:
    """The core grid: a header of NC labels, then devices; several devices share a line when
    ``max_rows`` is short. Cores no process lists show ``--`` (no runtime attached), not 0 %."""
    if hardware.device_count == 0:
        return Text("waiting for the first report…", style=S_DIM)
    per_dev = max(hardware.cores_per_device, 1)
    per_line = devices_per_line(hardware, max_rows)
    cells = per_line * per_dev
    value_w = TF_W if flops_mode else PCT_W
    cell_w = max((width - per_line * LABEL_W) // cells - 1, value_w)
    bar_w = cell_w - value_w if cell_w - value_w >= 3 else 0
    cell_w = bar_w + value_w
    header = Text()
    for _ in range(per_line):
        header.append(" " * LABEL_W)
        for local in range(per_dev):
            header.append(f"NC{local}".center(cell_w) + " ")
    lines = [_line(header, width)]
    highlighted = set(highlight)
    for first in range(0, hardware.device_count, per_line):
        line = Text()
        for device in range(first, min(first + per_line, hardware.device_count)):
            line.append(f"ND{device:<3}"[:LABEL_W].ljust(LABEL_W))
            for local in range(per_dev):
                core = device * per_dev + local
                line.append_text(_cell(data.utilization.get(core), data.flops.get(core), bar_w, flops_mode,
                                       core in highlighted, unused))
                line.append(" ")
        lines.append(_line(line, width))
    return _join(lines)


# -- vCPU and memory summary -------------------------------------------------------------------

def _vcpu_bar(label: str, user: float | None, system: float | None, width: int, unused: str,
              missing: str = "[not collected]") -> Text:
    text = Text(f"{label:<19}")
    known = user is not None and system is not None
    value = f"[{fmt.percent(user)},{fmt.percent(system)}]" if known else missing
    bar_w = max(width - 19 - len(value), 0)
    if user is not None and system is not None and bar_w:
        u = min(round(user / 100 * bar_w), bar_w)
        s = min(round(system / 100 * bar_w), bar_w - u)
        text.append("|" * u, style=S_USED)
        text.append("|" * s, style=S_SYS)
        text.append(unused * (bar_w - u - s), style=S_UNUSED)
    else:
        text.append(" " * bar_w)
    text.append(value, style=None if user is not None else S_DIM)
    return _line(text, width)


def vcpu(frame: Frame, data: TabData, width: int, unused: str = "|") -> Text:
    system = frame.system
    missing = "[no runtime]" if data.processes == 0 else "[not collected]"
    return _join([_vcpu_bar("System vCPU Usage", system.vcpu_user, system.vcpu_system, width, unused),
                  _vcpu_bar("Runtime vCPU Usage", data.vcpu_user, data.vcpu_system, width, unused, missing)])


def _columns(label: str, fields: Sequence[tuple[str, str]], width: int, label_w: int = 21) -> Text:
    """``label`` then ``Key: value`` fields in equal columns; fields that do not fit go to the next
    line (indented) rather than off the edge."""
    room = max(width - label_w, 1)
    natural = [len(k) + 2 + len(v) + 2 for k, v in fields]
    equal = room // max(len(fields), 1)
    if max(natural, default=0) <= equal:
        widths = [equal] * len(fields)  # the real tool's equal columns
    elif sum(natural) <= room:
        spare = (room - sum(natural)) // len(fields)
        widths = [n + spare for n in natural]  # columns as wide as their text, spread out
    else:
        widths = natural  # wrap below, aligned under the first field
    lines = []
    line = Text(f"{label:<{label_w}}")
    used = 0
    for (key, value), w in zip(fields, widths):
        if used and used + w > room + 1:
            lines.append(_line(line, width))
            line, used = Text(" " * label_w), 0
        line.append(f"{key}: ")
        line.append(value, style=S_VALUE)
        line.append(" " * max(w - len(key) - 2 - len(value), 1))
        used += w
    lines.append(_line(line, width))
    return _join(lines)


COMPACT_SUMMARY_BELOW = 100
SHORT_LABELS = {"Total": "Total", "Tensors": "Tensors", "Constants": "Const", "DMA Buffers": "DMA",
                "App. Memory": "App", "Model Code": "Code", "Runtime Memory": "Runtime",
                "Model Scratchpad": "Scratch"}


def memory_summary(frame: Frame, data: TabData, width: int) -> Text:
    """Host and device memory by category (the real tool's two lines) and the host's own memory;
    below 100 columns the labels are abbreviated so the lines wrap less, never cut."""
    return summary_text(summary_fields(frame, data), width)


def summary_text(fields: tuple[list[tuple[str, str]], ...], width: int) -> Text:
    host, device, system = fields
    if width >= COMPACT_SUMMARY_BELOW:
        return _join([_columns("Host Used Memory", host, width),
                      _columns("Device Used Memory", device, width),
                      _columns("Host System Memory", system, width)])

    def short(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(SHORT_LABELS.get(k, k), v) for k, v in fields]

    return _join([_columns("Host", short(host), width, 8), _columns("Device", short(device), width, 8),
                  _columns("System", short(system), width, 8)])


def summary_fields(frame: Frame, data: TabData) -> tuple[list[tuple[str, str]], ...]:
    if data.host_memory is None and data.processes:
        host: list[tuple[str, str]] = [("Total", "not collected")]
    else:
        memory = data.host_memory or {}
        host = [("Total", fmt.size(sum(memory.values())))]
        host += [(HOST_MEMORY_LABELS[k], fmt.size(memory.get(k, 0))) for k in HOST_MEMORY_KEYS]
    device_mem = data.device_memory
    device = [("Total", fmt.size(sum(device_mem.values())))]
    device += [(DEVICE_MEMORY_LABELS[k], fmt.size(device_mem[k])) for k in DEVICE_MEMORY_KEYS]
    s = frame.system
    system = [("Used", f"{fmt.size(s.memory_used)} of {fmt.size(s.memory_total)}"),
              ("Swap", f"{fmt.size(s.swap_used)} of {fmt.size(s.swap_total)}")]
    if s.vcpu_count:
        system.append(("vCPUs", str(s.vcpu_count)))
    return host, device, system


# -- memory details tree -----------------------------------------------------------------------

TREE_COLS = (("Model ID", 10), ("Device Memory", 15), ("Host Memory", 13))


def tree_header(width: int) -> Text:
    cols = _tree_cols(width)
    text = Text(" " * max(width - sum(w for _, w in cols), 0))
    for name, w in cols:
        text.append(f"{name:<{w}}")
    return _line(text, width)


def _tree_cols(width: int) -> tuple[tuple[str, int], ...]:
    """Columns that fit: all three from 60 cells, then without Host, then without Model ID."""
    if width >= 60:
        return TREE_COLS
    if width >= 42:
        return TREE_COLS[:2]
    return (TREE_COLS[1],)


def tree_row(row: TreeRow, state: TreeState, width: int, selected: bool) -> Text:
    cols = _tree_cols(width)
    name_w = max(width - sum(w for _, w in cols), 8)
    marker = ("[-] " if is_expanded(state, row.key) else "[+] ") if row.expandable else ""
    name = fmt.fit("    " * row.depth + marker + row.label, name_w - 1)
    text = Text(f"{name:<{name_w}}")
    values = {"Model ID": row.model_id, "Device Memory": fmt.size(row.device_bytes),
              "Host Memory": fmt.size(row.host_bytes)}
    for col, w in cols:
        text.append(f"{values[col]:<{w}}")
    if row.dim:
        text.stylize(S_DIM)
    if selected:
        text.stylize(S_SELECTED)
    return _line(text, width)


def tree_lines(rows: Sequence[TreeRow], state: TreeState, width: int, height: int, offset: int,
               empty_message: str) -> Text:
    if not rows:
        return _join([_line(Text(empty_message, style=S_DIM), width)])
    shown = rows[offset:offset + max(height, 1)]
    return _join([tree_row(r, state, width, r.key == state.selected) for r in shown])


# -- tabs, hints, status -----------------------------------------------------------------------

def tab_bar(items: Sequence[Tab], selected: int, width: int) -> Text:
    """``Neuron Apps`` then ``[N]:tag`` tabs, the selected one as ``>[1]:all<``; when they do not fit,
    a window around the selected tab with ``<``/``>`` marks for what is off-screen."""
    labels = []
    for i, tab in enumerate(items):
        core = f"[{i + 1}]:{tab.label}" if i < MAX_NUMBERED_TABS else tab.label
        labels.append(f">{core}<" if i == selected else f" {core} ")
    head = Text(" Neuron Apps  ", style=S_TAB_LABEL)
    room = width - head.cell_len - 2
    first, last = selected, selected + 1
    used = len(labels[selected]) + 2 if labels else 0
    while True:  # grow the window both ways while it fits
        grown = False
        if last < len(labels) and used + len(labels[last]) + 2 <= room:
            used += len(labels[last]) + 2
            last += 1
            grown = True
        if first > 0 and used + len(labels[first - 1]) + 2 <= room:
            first -= 1
            used += len(labels[first]) + 2
            grown = True
        if not grown:
            break
    text = head
    text.append("‹ " if first > 0 else "  ", style=S_BAR)
    for i in range(first, last):
        text.append(fmt.fit(labels[i], room), style=S_TAB_SELECTED if i == selected else S_BAR)
        text.append("  ", style=S_BAR)
    if last < len(labels):
        text.append("›", style=S_BAR)
    return _based(_line(text, width), S_BAR)


HINTS = (("q", "quit", "quit"), ("arrows", "move tree selection", "move"),
         ("enter", "expand/collapse tree item", "open"), ("x", "expand/collapse entire tree", "all"),
         ("a/d", "previous/next tab", "tab"), ("f", "FLOPS on/off", "flops"), ("1-9", "select tab", "tab"),
         ("k", "signal process", "kill"), ("v", "extras", "extras"), ("<>", "sort", "sort"),
         ("/", "filter", "filter"), ("h", "help", "help"))


REAL_HINTS = 7  # the first seven are the real tool's; the rest are ours


def hint_bar(width: int) -> Text:
    """The hints spread evenly over the line: the real tool's words when they fit (ours short),
    else all short, else as many short ones as fit with ``h: help`` always last (abbreviated, not
    silently cut as the real tool's cells are)."""
    variants = ([f"{k}: {long if i < REAL_HINTS else short}" for i, (k, long, short) in enumerate(HINTS)],
                [f"{k}: {short}" for k, _, short in HINTS])
    for cells in variants:
        natural = sum(len(c) for c in cells)
        if natural + 2 * len(cells) <= width:
            gap = (width - natural) // len(cells)
            text = Text("".join(c.center(len(c) + gap) for c in cells))
            return _based(_line(text, width), S_BAR)
    cells = [f"{k}:{short}" for k, _, short in HINTS]
    keep: list[str] = []
    for c in cells[:-1]:
        if len(" ".join([*keep, c, cells[-1]])) <= width:
            keep.append(c)
    return _based(_line(Text(" ".join([*keep, cells[-1]])), width), S_BAR)


def status_line(frame: Frame, width: int) -> Text | None:
    """The one line of news: no activity, the stream's state, stopped processes, training jobs, or
    the latest problem; None if none."""
    return status_line_of(frame.status, frame.hardware, bool(frame.active), width, news_note(frame))


def training_note(frame: Frame) -> str:
    """``training pid 4100 llama2-7b/16xtrn1.32xlarge/...: 3 steps, 95.1 seq/s, MFU 38.2%, step p50
    10.8 s p99 10.9 s`` for each process running training steps, or ``""``."""
    parts = []
    for p in frame.active:
        t = p.training
        if t is None:
            continue
        mfu = "-" if t.mfu is None else f"{100 * t.mfu:.1f}%"
        lat = "" if t.step_p50_s is None else f", step p50 {_seconds(t.step_p50_s)}"
        lat += "" if t.step_p99_s is None else f" p99 {_seconds(t.step_p99_s)}"
        parts.append(f"training pid {p.pid} {t.layout}: {t.steps} steps, {t.seq_per_s:,.1f} seq/s, "
                     f"MFU {mfu}{lat}")
    return "; ".join(parts)


def _seconds(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def news_note(frame: Frame) -> str:
    """Stopped processes first, then training jobs (what the status line shows besides problems)."""
    return "  |  ".join(n for n in (stopped_note(frame), training_note(frame)) if n)


def stopped_note(frame: Frame) -> str:
    """``stopped (SIGSTOP): pid 4100 my_script.py (mlp); k then c resumes it``, or ``""``."""
    stopped = [p for p in frame.active if p.state == STOPPED]
    if not stopped:
        return ""
    which = ", ".join(names.describe(p) for p in stopped)
    return f"stopped (SIGSTOP): {which}; its cores are idle; k then c (SIGCONT) resumes it"


def status_line_of(status: SourceStatus, hardware: Hardware, active: bool, width: int,
                   stopped: str = "") -> Text | None:
    text = Text()
    if stopped:
        text.append(stopped, style=S_STOPPED)
    if status.message:
        if text:
            text.append("  |  ")
        text.append(status.message, style=S_WARN if not status.ended else S_ERROR)
    elif not active and hardware.cores:
        text.append("No Neuron activity: no process is using a NeuronCore", style=S_WARN)
    if status.errors:
        if text:
            text.append("  |  ")
        count = f" ({status.malformed} bad lines)" if status.malformed > 1 else ""
        text.append(f"{status.errors[-1]}{count}", style=S_ERROR)
    if hardware.error:
        if text:
            text.append("  |  ")
        text.append(f"hardware: {hardware.error}", style=S_ERROR)
    if not text:
        return None
    text.truncate(width, overflow="ellipsis")
    return _line(text, width)


# -- extras: engines, history, processes -------------------------------------------------------

def engines(hardware: Hardware, data: TabData, cores: Sequence[int], width: int, source_kind: str,
            unused: str = "|") -> Text:
    """Per-engine busy % of the selected core (live state only: a neuron-monitor report has none)."""
    if source_kind != "live":
        return _join([_line(Text(t, style=S_DIM), width) for t in (
            "per-engine busy time is not in neuron-monitor reports;",
            "run neuron-top on the host itself (live state)")])
    if not cores:
        return _line(Text("select a device or core in Memory Usage Details", style=S_DIM), width)
    core = next((c for c in cores if c in data.engine_busy), cores[0])
    name = f"ND{hardware.device_of(core)} NC{hardware.local_of(core)} (core {core})"
    busy = data.engine_busy.get(core)
    lines = [_line(Text(name, style="bold"), width)]
    if busy is None:
        lines.append(_line(Text("no process is using this core", style=S_DIM), width))
        return _join(lines)
    bar_w = max(width - 8 - PCT_W, 0)
    for engine in ENGINES:
        value = 100.0 * busy.get(engine, 0.0)
        text = Text(f"{engine:<8}")
        used = min(round(value / 100 * bar_w), bar_w)
        text.append("|" * used, style=S_USED)
        text.append(unused * (bar_w - used), style=S_UNUSED)
        text.append(f"[{fmt.percent(value)}]")
        lines.append(_line(text, width))
    hbm = data.hbm_bytes_per_s.get(core)
    lines.append(_line(Text(f"HBM     {fmt.rate(hbm)}"), width))
    return _join(lines)


def history(frame: Frame, data: TabData, tab: int | None, width: int) -> Text:
    """Sparklines: HBM traffic and NeuronLink throughput of the tab, then one per core."""
    hist = frame.history
    lines = []
    if hist.has_hbm:
        link_now = (data.link_bytes_per_s or {}).get("neuronlink", 0.0)
        for label, series, now in (("HBM", hist.hbm.get(tab, ()), sum(data.hbm_bytes_per_s.values())),
                                   ("NeuronLink", hist.links.get(tab, ()), link_now)):
            value = fmt.rate(now)
            spark_w = max(width - 11 - len(value) - 1, 0)
            lines.append(_line(Text(f"{label:<11}") + Text(fmt.sparkline(series, spark_w), style=S_USED)
                               + Text(" " + value), width))
    else:
        note = "HBM / NeuronLink traffic: not in neuron-monitor reports"
        lines.append(_line(Text(note, style=S_DIM), width))
    hw = frame.hardware
    per_dev = max(hw.cores_per_device, 1)
    cores = hist.cores.get(tab, {})
    spark_w = max((width - LABEL_W) // per_dev - 1, 1)
    for device in range(hw.device_count):
        line = Text(f"ND{device:<3}"[:LABEL_W].ljust(LABEL_W))
        for local in range(per_dev):
            core_series = cores.get(device * per_dev + local)
            if core_series is None:
                line.append("·" * spark_w, style=S_UNUSED)
            else:
                line.append(fmt.sparkline(core_series, spark_w, top=100.0), style=S_USED)
            line.append(" ")
        lines.append(_line(line, width))
    return _join(lines)


PROCESS_COLS = (("PID", 8), ("USER", 9), ("COMMAND", 0), ("CORES", 8), ("NC%", 7), ("HOST MEM", 9),
                ("DEV MEM", 9), ("AGE", 7), ("STATE", 8))
DEFAULT_VIEW = TableView()


def _process_cols(width: int) -> list[tuple[str, int]]:
    """Drop the least needed columns until the command keeps at least 10 cells."""
    cols = list(PROCESS_COLS)
    for drop in ("AGE", "USER", "HOST MEM"):
        if width - sum(w for _, w in cols) >= 10:
            break
        cols = [c for c in cols if c[0] != drop]
    return cols


def sort_columns(width: int) -> tuple[SortKey, ...]:
    """The columns the table shows at ``width``, as sort keys (what ``<`` ``>`` cycle through)."""
    return tuple(SortKey(name) for name, _ in _process_cols(width))


def process_header(width: int, view: TableView = DEFAULT_VIEW) -> Text:
    """Column headings; the sorted one is highlighted with its direction (``DEV MEM▼``), as htop."""
    cols = _process_cols(width)
    command_w = max(width - sum(w for _, w in cols), 4)
    text = Text()
    for name, w in cols:
        w = w or command_w
        if name == view.sort.value:
            heading = name + ("▼" if view.descending else "▲")
            text.append(heading, style=S_SORTED)
            text.append(" " * max(w - len(heading), 0))
        else:
            text.append(f"{name:<{w}}")
    return _based(_line(text, width), "bold")


def process_section(view: TableView, shown: int, total: int) -> str:
    """The table's section bar: ``Processes (2 of 5, filter "bert")`` when filtered."""
    if not view.filter:
        return "Processes"
    return f'Processes: {shown} of {total} match "{view.filter}" (/ edits)'


def process_state(p: ProcessSnapshot) -> tuple[str, str]:
    """Flag text and style: exited and stale holders stand out (§7: holders that are gone or stuck)."""
    if p.state == STOPPED:
        return "STOPPED", S_STOPPED
    if p.state == EXITED:
        return "EXITED", S_ERROR
    if p.state == ERROR:
        return "ERROR", S_ERROR
    if p.state == STALE:
        return "STALE", S_WARN
    if p.group_errors:
        return "PARTIAL", S_WARN
    return "ok", S_VALUE


def _nc_percent(p: ProcessSnapshot) -> str:
    """NC%: the mean utilisation of the process's cores, as the grid prints a core (``  9.30%``)."""
    value = utilization(p)
    return "-" if value is None else fmt.percent(value).strip()


def process_row(p: ProcessSnapshot, now: float, width: int, selected: bool) -> Text:
    cols = _process_cols(width)
    command_w = max(width - sum(w for _, w in cols), 4)
    started = p.started_at
    age = fmt.age(now - started) if started is not None else "-"
    if not p.started_exact and started is not None:
        age = "≥" + age  # only "first seen in the stream"
    flag, flag_style = process_state(p)
    command = names.command_text(p)  # the script, not the interpreter's path
    values = {"PID": str(p.pid), "USER": p.user or "-", "COMMAND": command,
              "CORES": fmt.core_ranges(p.held_cores), "NC%": _nc_percent(p),
              "HOST MEM": fmt.size(p.host_bytes),
              "DEV MEM": fmt.size(p.device_memory_bytes), "AGE": age, "STATE": flag}
    text = Text()
    for name, w in cols:
        w = w or command_w
        cell = fmt.fit(values[name], w - 1).ljust(w)
        text.append(cell, style=flag_style if name == "STATE" else None)
    if p.state == EXITED:
        text.stylize(S_DIM)
    if selected:
        text.stylize("reverse")
    return _line(text, width)


def processes(frame: Frame, width: int, cursor: int | None, height: int | None = None,
              view: TableView = DEFAULT_VIEW) -> Text:
    """The process table in the view's order and filter; ``cursor`` indexes the shown rows."""
    procs = ordered(frame.processes, view, frame.taken_at)
    header = process_header(width, view)
    if not procs:
        empty = f'no process matches "{view.filter}"' if frame.processes else "no Neuron processes"
        return _join([header, _line(Text(empty, style=S_DIM), width)])
    start = 0
    if height is not None and cursor is not None and height > 1:
        start = max(0, min(cursor - (height - 2), len(procs) - (height - 1)))
    shown = procs[start:start + (height - 1 if height else len(procs))]
    rows = [process_row(p, frame.taken_at, width, cursor == start + i) for i, p in enumerate(shown)]
    return _join([header, *rows])


__all__ = [
    "PROCESS_COLS",
    "engines",
    "grid",
    "grid_rows_needed",
    "hint_bar",
    "history",
    "memory_summary",
    "news_note",
    "no_activity",
    "process_header",
    "process_row",
    "process_section",
    "process_state",
    "processes",
    "section",
    "sort_columns",
    "status_line",
    "status_line_of",
    "stopped_note",
    "tab_bar",
    "title",
    "tool_version",
    "training_note",
    "tree_header",
    "tree_lines",
    "tree_row",
    "util_header",
    "util_notes",
    "util_section",
    "vcpu",
]
