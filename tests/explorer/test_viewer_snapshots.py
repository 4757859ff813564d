"""Pictures of the profile viewer (pytest-textual-snapshot) at 80x24 and 160x50: our bundled bert-layer
profile and a hand-made profile in the real Neuron Explorer layout. Deterministic: the profiles are
fixed (the sample is committed, the real-layout one is built from constants), names shown are never
temporary paths, and source files are ``tests.fixtures.source_tree``'s, written at test time from
constants and the sample's own stack frames.

Update after an intended change with ``pytest tests/explorer/test_viewer_snapshots.py --snapshot-update``
and look at the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.pilot import settle, viewer
from tests.fixtures.real_layout import Shape, real_layout_profile
from tests.fixtures.samples import BERT

SIZES = [(80, 24), (160, 50)]


async def ready(pilot) -> None:  # type: ignore[no-untyped-def]
    await settle(pilot)
    # The source pane scrolls to its marked line once DataTable has measured the new rows, which it
    # does when idle: wait for that, then put the line where the pane puts it, so the picture does
    # not depend on whether the idle pass came before the screenshot.
    pane = pilot.app.query_one("#source")
    table = pilot.app.query_one("#source-table")
    for _ in range(200):
        await pilot.pause()
        if table.virtual_size.height >= table.row_count:
            break
    if pane.marked:
        row = pane.marked[0][1] - 1
        pane.scroll_pending = row
        pane._scroll_to_line(row, 0)
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x50"])
def test_our_profile(snap_compare, size: tuple[int, int], source_root: Path) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(viewer(BERT, source_root), terminal_size=size, run_before=ready)


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "160x50"])
def test_real_layout_profile(  # type: ignore[no-untyped-def]
    snap_compare, tmp_path: Path, size: tuple[int, int], source_root: Path
) -> None:
    app = viewer(real_layout_profile(tmp_path, Shape.LLAMA), source_root)
    assert snap_compare(app, terminal_size=size, run_before=ready)


def test_op_opened_with_code_marked(snap_compare, source_root: Path) -> None:  # type: ignore[no-untyped-def]
    """An op opened to its instructions, its source line marked, the timeline on its time range."""

    async def open_op(pilot) -> None:  # type: ignore[no-untyped-def]
        await settle(pilot)
        await pilot.press("slash")
        pilot.app.query_one("#query").value = "dot.45"
        await pilot.press("enter", "enter")
        await ready(pilot)

    assert snap_compare(viewer(BERT, source_root), terminal_size=(160, 50), run_before=open_op)
