"""The terminal viewer and the GUI flame chart show the same hierarchy, read by the one loader
(``formats.hierarchy_read``): same layers, parents, op -> layer links, busy times and instruction
counts -- and on a profile with junk in ``FrameworkNode.children_ids`` both survive, skip the junk and
say how many ids they skipped (the GUI's own parser used to raise on it)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from textual.widgets import Static

from explorer.gui.flame_tree import load_flame_tree
from explorer.gui.session import open_session
from explorer.viewer.data import ProfileData
from explorer.viewer.viewer_app import ViewerApp
from formats.dataset import find_profiles
from formats.reader import open_profile
from tests.fixtures.samples import BERT

NOTE = "2 malformed ids skipped"


def _profile_dir(root: Path) -> Path:
    return next(p.parent for p in root.rglob("FrameworkNode.parquet"))


def junk_profile(tmp_path: Path) -> Path:
    """The BERT sample with two junk elements in the first non-empty ``children_ids``."""
    root = tmp_path / "junk"
    shutil.copytree(BERT, root)
    file = _profile_dir(root) / "FrameworkNode.parquet"
    table = pq.read_table(file)
    ids = table.column("children_ids").to_pylist()
    first = next(i for i, text in enumerate(ids) if text != "[]")
    ids[first] = ids[first].replace(", ", ", oops, ", 1).replace("]", ", 1.5]")
    index = table.schema.get_field_index("children_ids")
    table = table.set_column(index, table.schema.field(index), pa.array(ids, pa.string()))
    pq.write_table(table, file)
    assert pc.sum(pc.match_substring(table.column("children_ids"), "oops")).as_py() == 1
    return root


def viewer_tree(root: Path) -> tuple[dict[str, object], dict[object, object], str]:
    """(layer path -> (parent, time, instructions), op id -> (layer, time, instructions), note)."""
    data = ProfileData(open_profile(_profile_dir(root)), "x")
    try:
        hierarchy = data.overview().hierarchy
    finally:
        data.close()
    layers, ops = {}, {}
    for node in hierarchy.nodes.values():
        parent = hierarchy.nodes[node.parent] if node.parent else None
        parent_layer = parent.layer if parent is not None else None
        if node.kind == "layer" and node.layer is not None:
            layers[node.layer] = (parent_layer, node.stats.time_ns, node.stats.instructions)
        elif node.kind == "hlo" and node.hlo_ref is not None:
            ops[node.hlo_ref[1]] = (parent_layer, node.stats.time_ns, node.stats.instructions)
    return layers, ops, hierarchy.malformed


def gui_tree(root: Path) -> tuple[dict[str, object], dict[object, object], str]:
    session = open_session([_profile_dir(root)])
    try:
        tree = load_flame_tree(session.profiles[0])
    finally:
        session.close()
    layers = {n.name: (n.parent, n.active_ns, n.instructions) for n in tree.nodes if n.kind == "layer"}
    ops = {n.raw_id: (n.parent, n.active_ns, n.instructions) for n in tree.nodes if n.kind == "hlo"}
    return layers, ops, tree.malformed


@pytest.mark.parametrize("junk", [False, True], ids=["clean", "junk-ids"])
def test_both_views_show_the_same_tree(tmp_path: Path, junk: bool) -> None:
    root = junk_profile(tmp_path) if junk else BERT
    viewer_layers, viewer_ops, viewer_note = viewer_tree(root)
    gui_layers, gui_ops, gui_note = gui_tree(root)
    assert viewer_layers and viewer_ops
    assert viewer_layers == gui_layers
    assert viewer_ops == gui_ops
    assert any(layer is not None for layer, _, _ in gui_ops.values())  # ops do hang under layers
    assert viewer_note == gui_note == (NOTE if junk else "")


def test_junk_ids_lose_only_themselves(tmp_path: Path) -> None:
    """The junk elements are skipped, the good ids around them still link their ops."""
    assert viewer_tree(junk_profile(tmp_path))[1] == viewer_tree(BERT)[1]


def test_viewer_title_says_ids_were_skipped(tmp_path: Path) -> None:
    entries, _ = find_profiles(junk_profile(tmp_path))
    app = ViewerApp(entries)

    async def run() -> str:
        async with app.run_test(size=(160, 36)) as pilot:
            for _ in range(400):
                await pilot.pause()
                if app.hierarchy is not None:
                    break
            return str(app.query_one("#title", Static).render())

    assert NOTE in asyncio.run(run())
