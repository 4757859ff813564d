"""The "Memory Usage Details" tree: rows from a tab's data, and the real tool's navigation rules.

Rows: ``[-] ND 0`` -> ``[-] NC 0`` -> ``[+] <model>`` -> category rows. Accounting follows the
trn1 screenshot (sys-tools.md §3.2): parent = sum of children everywhere. Under a core, model rows
carry the memory their subgraphs allocated and the core's category rows hold what no model accounts
for (the shared scratchpad, the runtime's own memory), zeros hidden; under a model, its categories.
Cores of the grid with no memory do not appear; devices only with at least one core.

Navigation is pure (``TreeState`` in, ``TreeState`` out) so the keys can be tested without a screen:
up/down move over visible rows and wrap; left collapses, or moves to the parent when already
collapsed; right expands, or moves to the first child when already expanded; Enter toggles; ``x``
expands or collapses everything, collapsing moves the selection to its device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.top import fmt
from explorer.top.aggregate import TabData
from explorer.top.snapshots import DEVICE_MEMORY_KEYS, DEVICE_MEMORY_LABELS, Hardware

Key = tuple  # ("nd", d) | ("nc", core) | ("model", pid, model_id, core) | (*parent, "cat", name)
MODEL_NAME_WIDTH = 50


@dataclass(frozen=True)
class TreeRow:
    key: Key
    depth: int
    label: str
    model_id: str
    device_bytes: int
    host_bytes: int
    expandable: bool
    dim: bool = False
    parent: Key | None = None


def build_rows(hardware: Hardware, data: TabData) -> tuple[TreeRow, ...]:
    """Every row of the full tree, in display order (pre-order)."""
    per_device = max(hardware.cores_per_device, 1)
    models_by_core: dict[int, list] = {}
    for model in data.models:
        models_by_core.setdefault(model.core, []).append(model)
    cores = sorted(set(data.core_memory) | set(models_by_core))
    rows: list[TreeRow] = []
    devices: dict[int, list[int]] = {}
    for core in cores:
        devices.setdefault(core // per_device, []).append(core)
    for device, members in sorted(devices.items()):
        device_key: Key = ("nd", device)
        device_index = len(rows)
        rows.append(TreeRow(device_key, 0, f"ND {device:2d}", "", 0, 0, True))
        device_bytes = device_host = 0
        for core in members:
            core_rows, core_bytes, core_host = _core_rows(core, per_device, device_key, data, models_by_core)
            rows.extend(core_rows)
            device_bytes += core_bytes
            device_host += core_host
        rows[device_index] = TreeRow(device_key, 0, f"ND {device:2d}", "", device_bytes, device_host, True)
    return tuple(rows)


def _core_rows(core: int, per_device: int, parent: Key, data: TabData,
               models_by_core: dict[int, list]) -> tuple[list[TreeRow], int, int]:
    key: Key = ("nc", core)
    rows: list[TreeRow] = []
    models = sorted(models_by_core.get(core, []), key=lambda m: (m.pid, m.model_id))
    totals = dict(data.core_memory.get(core, dict.fromkeys(DEVICE_MEMORY_KEYS, 0)))
    unclaimed = dict(totals)
    host_total = 0
    for model in models:
        model_key: Key = ("model", model.pid, model.model_id, core)
        rows.append(TreeRow(model_key, 2, fmt.tail(model.name, MODEL_NAME_WIDTH), str(model.model_id),
                            model.device_bytes, model.host_bytes, True, dim=not model.is_running, parent=key))
        for cat in DEVICE_MEMORY_KEYS:
            if model.device_memory.get(cat, 0) > 0:  # zeros hidden, as under a core
                rows.append(TreeRow((*model_key, "cat", cat), 3, DEVICE_MEMORY_LABELS[cat], "",
                                    model.device_memory[cat], 0, False, dim=not model.is_running,
                                    parent=model_key))
            unclaimed[cat] = max(unclaimed.get(cat, 0) - model.device_memory.get(cat, 0), 0)
        host_total += model.host_bytes
    for cat in DEVICE_MEMORY_KEYS:
        if unclaimed.get(cat, 0) > 0:
            rows.append(TreeRow((*key, "cat", cat), 2, DEVICE_MEMORY_LABELS[cat], "", unclaimed[cat], 0,
                                False, parent=key))
    device_bytes = sum(r.device_bytes for r in rows if r.parent == key)
    head = TreeRow(key, 1, f"NC {core % per_device:d}", "", device_bytes, host_total, bool(rows),
                   parent=parent)
    return [head, *rows], device_bytes, host_total


@dataclass(frozen=True)
class TreeState:
    """Which rows differ from their default expansion, and which row is selected."""

    toggled: frozenset = field(default_factory=frozenset)
    selected: Key | None = None
    all_collapsed: bool = False  # the last ``x`` collapsed everything


def default_expanded(key: Key) -> bool:
    """Devices and cores open, models closed (the real tool's first screen)."""
    return key[0] in ("nd", "nc") and "cat" not in key


def is_expanded(state: TreeState, key: Key) -> bool:
    return default_expanded(key) != (key in state.toggled)


def visible_rows(rows: tuple[TreeRow, ...], state: TreeState) -> list[TreeRow]:
    """Rows whose ancestors are all expanded."""
    out = []
    hidden_below: int | None = None
    for row in rows:
        if hidden_below is not None:
            if row.depth > hidden_below:
                continue
            hidden_below = None
        out.append(row)
        if row.expandable and not is_expanded(state, row.key):
            hidden_below = row.depth
    return out


def _set(state: TreeState, key: Key, expanded: bool) -> TreeState:
    toggled = set(state.toggled)
    if expanded == default_expanded(key):
        toggled.discard(key)
    else:
        toggled.add(key)
    return TreeState(frozenset(toggled), state.selected, state.all_collapsed)


def settle(rows: tuple[TreeRow, ...], state: TreeState) -> TreeState:
    """Keep the selection on a visible row after the tree changed: the same row, else its nearest
    visible ancestor, else the first row."""
    visible = visible_rows(rows, state)
    keys = {r.key for r in visible}
    if state.selected in keys:
        return state
    by_key = {r.key: r for r in rows}
    key = state.selected
    while key is not None and key in by_key and key not in keys:
        key = by_key[key].parent
    if key not in keys:
        key = visible[0].key if visible else None
    return TreeState(state.toggled, key, state.all_collapsed)


def move(rows: tuple[TreeRow, ...], state: TreeState, step: int) -> TreeState:
    """Up (-1) / down (+1) over visible rows, wrapping at the ends."""
    state = settle(rows, state)
    visible = visible_rows(rows, state)
    if not visible:
        return state
    index = next(i for i, r in enumerate(visible) if r.key == state.selected)
    return TreeState(state.toggled, visible[(index + step) % len(visible)].key, state.all_collapsed)


def left(rows: tuple[TreeRow, ...], state: TreeState) -> TreeState:
    state = settle(rows, state)
    row = next((r for r in rows if r.key == state.selected), None)
    if row is None:
        return state
    if row.expandable and is_expanded(state, row.key):
        return _set(state, row.key, False)
    if row.parent is not None:
        return TreeState(state.toggled, row.parent, state.all_collapsed)
    return state


def right(rows: tuple[TreeRow, ...], state: TreeState) -> TreeState:
    state = settle(rows, state)
    row = next((r for r in rows if r.key == state.selected), None)
    if row is None or not row.expandable:
        return state
    if not is_expanded(state, row.key):
        return _set(state, row.key, True)
    child = next((r for r in rows if r.parent == row.key), None)
    return TreeState(state.toggled, child.key, state.all_collapsed) if child else state


def toggle(rows: tuple[TreeRow, ...], state: TreeState) -> TreeState:
    state = settle(rows, state)
    row = next((r for r in rows if r.key == state.selected), None)
    if row is None or not row.expandable:
        return state
    return _set(state, row.key, not is_expanded(state, row.key))


def toggle_all(rows: tuple[TreeRow, ...], state: TreeState) -> TreeState:
    """Expand everything, or (if the last ``x`` expanded) collapse everything onto the device rows."""
    expandable = [r.key for r in rows if r.expandable]
    if state.all_collapsed or not _everything_open(rows, state):
        toggled = frozenset(k for k in expandable if not default_expanded(k))
        return settle(rows, TreeState(toggled, state.selected, all_collapsed=False))
    toggled = frozenset(k for k in expandable if default_expanded(k))
    by_key = {r.key: r for r in rows}
    key = state.selected
    while key is not None and key in by_key and by_key[key].parent is not None:
        key = by_key[key].parent
    return settle(rows, TreeState(toggled, key, all_collapsed=True))


def _everything_open(rows: tuple[TreeRow, ...], state: TreeState) -> bool:
    return all(is_expanded(state, r.key) for r in rows if r.expandable)


def selected_cores(state: TreeState, hardware: Hardware) -> tuple[int, ...]:
    """Cores the selection stands for (the grid highlights them; the engine panel shows the first)."""
    key = state.selected
    if key is None:
        return ()
    if key[0] == "nd":
        per = max(hardware.cores_per_device, 1)
        return tuple(range(key[1] * per, (key[1] + 1) * per))
    if key[0] == "nc":
        return (key[1],)
    if key[0] == "model":
        return (key[3],)
    return ()


__all__ = ["TreeRow", "TreeState", "build_rows", "default_expanded", "is_expanded", "left", "move",
           "right", "selected_cores", "settle", "toggle", "toggle_all", "visible_rows"]

