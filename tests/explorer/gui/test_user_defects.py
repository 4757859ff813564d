"""Defects found when the GUI was tried as a user (issue 12 §3): each test failed before its fix.

The display check (Qt's xcb plugin aborts the process without libxcb-cursor0), a missing path named
before any display check, W/S after the colour combo, ``--range`` past the end, ids as plain
numbers, the Source tab at the hottest line, an interrupted capture marked, File > Open, F1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT, LLAMA_TP2, REPO

require_gui()


def _bert_copy(tmp_path: Path, name: str = "bert") -> Path:
    source = next(p.parent for p in BERT.rglob("Instruction.parquet"))
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


# -- the display check -----------------------------------------------------------------------------


def test_package_names_and_missing_libraries() -> None:
    from explorer.gui import platformcheck

    assert platformcheck.package_of("libxcb-cursor.so.0") == "libxcb-cursor0"
    assert platformcheck.package_of("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert platformcheck.package_of("libxcb-icccm.so.4") == "libxcb-icccm4"

    def refuse(path: str) -> None:
        raise OSError("libxcb-cursor.so.0: cannot open shared object file: No such file or directory")

    missing = platformcheck.missing_libraries(Path("/x/libqxcb.so"), load=refuse, ldd="")
    assert missing == ["libxcb-cursor.so.0"]
    assert platformcheck.missing_libraries(Path("/x/libqxcb.so"), load=lambda p: None, ldd="") == []
    line = platformcheck.xcb_error(missing)
    assert "apt-get install libxcb-cursor0" in line and "\n" not in line
    env = {"DISPLAY": ":0"}
    assert platformcheck.uses_xcb(env, "linux")
    assert not platformcheck.uses_xcb({**env, "QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert platformcheck.uses_xcb({"QT_QPA_PLATFORM": "xcb"}, "linux")
    assert not platformcheck.uses_xcb(env, "darwin")


def test_missing_xcb_library_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Qt would print its plugin paragraph and abort (SIGABRT); the command checks first."""
    from explorer.gui import launcher, platformcheck

    if sys.platform != "linux":
        pytest.skip("the xcb platform plugin is Linux's")

    monkeypatch.setenv("DISPLAY", ":77")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(platformcheck, "xcb_plugin", lambda: Path("/nowhere/libqxcb.so"))
    monkeypatch.setattr(
        platformcheck,
        "missing_libraries",
        lambda plugin: ["libxcb-cursor.so.0"],
    )
    opened: list[object] = []
    monkeypatch.setattr(launcher, "_open_window", lambda *a: opened.append(a))
    assert launcher.main([str(BERT)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "apt-get install libxcb-cursor0" in err[0], err
    assert not opened


def test_missing_path_is_named_before_the_display_check() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    done = subprocess.run(
        [sys.executable, "-m", "explorer.gui.launcher", "/nonexistent"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2
    assert len(lines) == 1 and "/nonexistent" in lines[0] and "no such profile" in lines[0], done.stderr


# -- keys ------------------------------------------------------------------------------------------


def test_w_and_s_still_zoom_after_the_colour_combo(window_factory: Any, qtbot: Any) -> None:
    from PySide6.QtCore import Qt

    window = window_factory(BERT)
    window.activateWindow()
    qtbot.waitUntil(lambda: window.isActiveWindow(), timeout=3000)
    combo = window.mode_box
    combo.setFocus()  # as after clicking it
    combo.setCurrentIndex(combo.findData("opcode"))
    combo.activated.emit(combo.currentIndex())
    before = window.timeline.time_range()
    focused = window.focusWidget() or combo
    qtbot.keyClick(focused, Qt.Key.Key_W)
    after = window.timeline.time_range()
    assert after[1] - after[0] < 0.9 * (before[1] - before[0]), "W did not zoom in"
    qtbot.keyClick(window.focusWidget() or combo, Qt.Key.Key_S)
    again = window.timeline.time_range()
    assert again[1] - again[0] > after[1] - after[0], "S did not zoom out"
    # a text field keeps its letters
    window.tabs.setCurrentWidget(window.search_panel)
    window.search_panel.text.setFocus()
    qtbot.keyClick(window.search_panel.text, Qt.Key.Key_W)
    assert window.search_panel.text.text().lower() == "w"
    assert window.timeline.time_range() == again


def test_f1_opens_the_shortcuts_dialog(window_factory: Any, qtbot: Any) -> None:
    from PySide6.QtCore import Qt

    window = window_factory(BERT)
    window.activateWindow()
    qtbot.waitUntil(lambda: window.isActiveWindow(), timeout=3000)
    qtbot.keyClick(window.timeline.plot, Qt.Key.Key_F1)
    dialog = getattr(window, "shortcuts_dialog", None)
    assert dialog is not None and dialog.isVisible()
    texts = [dialog.table.item(r, 0).text() for r in range(dialog.table.rowCount())]
    assert any("W / S" in t for t in texts) and any("Shift+drag" in t for t in texts)
    dialog.close()


# -- --range past the end ------------------------------------------------------------------------


def test_range_past_the_end_is_clamped_and_counters_stop_at_the_end(qt_app: Any, tmp_path: Path) -> None:
    from explorer.gui.screenshot import render_screenshot

    out = tmp_path / "past.png"
    layout = render_screenshot([BERT], out, size=(1200, 800), time_range=(10**12, 2 * 10**12))
    assert layout.warnings and "outside the profile" in layout.warnings[0]


def test_counter_band_is_not_drawn_past_the_profile_end(window_factory: Any) -> None:
    from explorer.gui.rows import COUNTER

    window = window_factory(BERT)
    timeline = window.timeline
    lo, hi = timeline.span
    timeline.set_range(hi + (hi - lo) * 0.2, hi + (hi - lo) * 0.9)  # panned past the end
    frame = timeline.fetch_now()
    picture = frame.picture
    counters = [i for i in frame.request.rows if window.rows[i].kind == COUNTER]
    assert counters
    for index in counters:
        slot = picture.rows.index(index)
        band = picture.image[slot * picture.row_px + 2 : (slot + 1) * picture.row_px - 2]
        background = {tuple(c) for c in band.reshape(-1, 4).tolist()}
        assert background <= {(255, 255, 255, 255), (246, 247, 250, 255), (214, 218, 226, 255)}, (
            f"{window.rows[index].label} drawn past the end"
        )


def test_cli_range_past_the_end_warns(tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    done = subprocess.run(
        [sys.executable, "-m", "explorer.gui.launcher", str(BERT), "--screenshot", str(out),
         "--range", "5s:6s"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("neuron-explorer")]
    assert len(lines) == 1 and "warning" in lines[0] and "outside the profile" in lines[0], done.stderr


# -- panels ---------------------------------------------------------------------------------------


def test_ids_are_plain_numbers() -> None:
    from explorer.gui.details import _value

    assert _value("id", 1234567) == "1234567"
    assert _value("raw_hlo_id", 1234567.0) == "1234567"
    assert _value("packet_aggregation_id", 98765432) == "98765432"
    assert _value("pcore_idx", 1) == "1"
    assert _value("active_time_percent", 0.316) == "31.6%"  # *_percent fields are fractions
    assert _value("hbm_read_bytes", 332 * 2**20) == "332.0 MiB"


def test_details_show_ids_plainly(window_factory: Any) -> None:
    from explorer.gui.details import instruction_details
    from formats.sqlsource import TableSource

    window = window_factory(LLAMA_TP2)
    loaded = window.session.profiles[0]
    relation = TableSource(loaded.profile, "Instruction").relation()
    found = loaded.queries.rows(f"SELECT max(id) AS id FROM {relation}")
    details = instruction_details(loaded, int(found[0]["id"]))
    assert details is not None
    for name, value in details.fields:
        if name.endswith(("_id", "_idx")) and value != "–":
            assert "," not in value and "e+" not in value, (name, value)


def test_source_tab_opens_at_the_hottest_line(window_factory: Any) -> None:
    window = window_factory(BERT, size=(1500, 700))
    panel = window.source_panel
    times = window.source_times
    assert times is not None and times.files
    per_line = times.lines_of(panel.path)
    hottest = max(per_line, key=lambda n: per_line[n].self_ns)
    assert panel.hottest_line == hottest
    window.tabs.setCurrentWidget(panel)
    window.show()
    row = next(r for r in range(panel.table.rowCount()) if panel.table.item(r, 0).text() == str(hottest))
    rect = panel.table.visualItemRect(panel.table.item(row, 0))
    assert panel.table.viewport().rect().intersects(rect), "the hottest line is not in view"


def test_incomplete_capture_is_marked(window_factory: Any, tmp_path: Path) -> None:
    profile = _bert_copy(tmp_path, "bert.incomplete")
    window = window_factory(profile)
    assert window.session.profiles[0].incomplete
    assert "INCOMPLETE" in window.windowTitle()
    assert window.incomplete_mark.isVisible()
    complete = window_factory(_bert_copy(tmp_path, "bert"))
    assert "INCOMPLETE" not in complete.windowTitle()


def test_file_open_opens_a_new_window(window_factory: Any, tmp_path: Path) -> None:
    window = window_factory(BERT)
    opened = window.open_paths([str(LLAMA_TP2)])
    assert opened is not None and len(opened.session.profiles) == 2
    assert window.open_paths([str(tmp_path / "missing")]) is None
    assert "could not open" in window.statusBar().currentMessage()
    opened.release()
    opened.close()


# -- dependencies drawn ----------------------------------------------------------------------------


def test_selected_instruction_dependencies_are_drawn_as_arrows(window_factory: Any, qt_app: Any) -> None:
    from formats.sqlsource import TableSource

    window = window_factory(BERT)
    loaded = window.session.profiles[0]
    flow = TableSource(loaded.profile, "Flow").relation()
    instr = TableSource(loaded.profile, "Instruction").relation()
    edge = loaded.queries.rows(
        f"SELECT f.in_id AS id, i.start_ts AS s, i.end_ts AS e FROM {flow} f "
        f"JOIN {instr} i ON i.id = f.in_id WHERE lower(f.in_table) = 'instruction' "
        f"AND lower(f.out_table) = 'dma_block' ORDER BY f.in_id LIMIT 1"
    )[0]
    window.reveal_instruction(0, int(edge["id"]), int(edge["s"]), int(edge["e"]))
    arrows = window.timeline.arrows
    assert arrows, "no arrow for the instruction's Flow edge"
    here = window.row_of_instruction(0, window.details.raw)
    successors = [d for d in window.details.dependencies if d.direction == "successor" and d.lane]
    assert len(arrows) == len([d for d in window.details.dependencies if d.lane and d.start_ts is not None])
    first = arrows[0]
    assert first.row0 == here and window.rows[first.row1].kind == "dma"
    assert first.t0 == int(edge["e"]) - loaded.origin
    assert first.t1 == successors[0].start_ts - loaded.origin
    assert first.kind == "DMA_TRIGGER"
    # drawn: the arrow's colour is on screen
    window.timeline.set_range(min(first.t0, first.t1) - 500, max(first.t0, first.t1) + 500)
    qt_app.processEvents()
    image = window.timeline.grab().toImage()
    found = any(
        abs(image.pixelColor(x, y).red() - 120) < 30 and abs(image.pixelColor(x, y).blue() - 160) < 30
        and image.pixelColor(x, y).green() < 100
        for x in range(0, image.width(), 2)
        for y in range(0, image.height(), 2)
    )
    assert found, "the arrow is not drawn"
    window.clear_highlight()
    assert window.timeline.arrows == []


def test_colour_legend_follows_the_mode_and_the_frame(window_factory: Any) -> None:
    from explorer.gui import colors

    window = window_factory(BERT)
    names = {e.name: e.rgba for e in window.legend_entries}
    assert names["Vector"] == colors.ENGINE_COLORS["Vector"]
    assert names["TensorMatrix · MATMUL"] == colors.ENGINE_COLORS["TensorMatrix"]
    assert "DMA queue" in names and "bar height" in window.legend.text()
    window.set_mode("opcode")
    window.timeline.fetch_now()
    names = {e.name: e.rgba for e in window.legend_entries}
    assert names["MATMUL"] == colors.name_color("MATMUL") and "ACTIVATE" in names
    assert "MATMUL" in window.legend.text()
    counts = [e.events for e in window.legend_entries if not e.name.startswith("no ")]
    assert counts == sorted(counts, reverse=True)
