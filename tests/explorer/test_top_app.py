"""neuron-top's screen driven through Textual's Pilot: every key binding, frames from the collection
thread, bad input shown on screen, small terminals, and signals sent to a real process."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest

from explorer.top.aggregate import tab_data
from explorer.top.live_source import LiveSource
from explorer.top.monitor_source import MonitorSource
from explorer.top.screens import HelpScreen, SignalScreen
from explorer.top.snapshots import CoreUse
from explorer.top.top_app import NeuronTopApp
from explorer.top.widgets import CoreGrid, MemoryTree, Panel, ProcessList
from tests.fixtures.top_frames import (
    MONITOR_STREAM,
    VERSION,
    idle_frame,
    live_frame,
    live_source,
    monitor_frame,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def run(coro):
    return asyncio.run(coro)


def app_with(frame) -> NeuronTopApp:
    return NeuronTopApp(frame=frame, version=VERSION)


def test_quit_keys():
    for key in ("q", "Q"):
        async def go(key=key):
            app = app_with(monitor_frame())
            async with app.run_test(size=(100, 40)) as pilot:
                await pilot.press(key)
                await pilot.pause()
                assert app._exit
        run(go())


def test_tabs_a_d_and_numbers():
    async def go():
        app = app_with(monitor_frame())
        async with app.run_test(size=(120, 40)) as pilot:
            assert app.tab_pid is None
            await pilot.press("d")
            assert app.tab_pid == 48213
            await pilot.press("D")
            assert app.tab_pid == 48990
            await pilot.press("d")
            assert app.tab_pid is None  # wraps
            await pilot.press("a")
            assert app.tab_pid == 48990
            await pilot.press("A", "1")
            assert app.tab_pid is None
            await pilot.press("3")
            assert app.tab_pid == 48990
            await pilot.press("9")  # no such tab: nothing changes
            assert app.tab_pid == 48990
            grid = app.query_one(CoreGrid).data[1]
            assert set(grid.utilization) == {6}  # only that process's core
            await pilot.press("2", "4", "5", "6", "7", "8")
            assert app.tab_pid == 48213
    run(go())


def test_f_switches_grid_to_tflops():
    async def go():
        app = app_with(monitor_frame())
        async with app.run_test(size=(120, 40)) as pilot:
            header = app.query_one("#util-header", Panel)
            assert "Avg: 59.74%, 5 of 32 cores" in header.data[0]  # over the cores in use
            assert not header.data[2]  # a neuron-monitor stream: no simulator caveat
            await pilot.press("f")
            assert app.flops_mode and "TF | Total:" in header.data[0]
            await pilot.press("F")
            assert not app.flops_mode
    run(go())


def test_tree_keys_arrows_enter_x():
    async def go():
        app = app_with(monitor_frame())
        async with app.run_test(size=(120, 50)) as pilot:
            tree = app.query_one(MemoryTree)
            assert tree.has_focus and app.tree_state.selected == ("nd", 0)
            await pilot.press("up")
            assert app.tree_state.selected != ("nd", 0)  # wrapped to the last row
            await pilot.press("down")
            assert app.tree_state.selected == ("nd", 0)
            await pilot.press("right")
            assert app.tree_state.selected == ("nc", 0)
            assert app.query_one(CoreGrid).data[3] == (0,)  # the grid highlights the selected core
            await pilot.press("down", "enter")
            model = app.tree_state.selected
            assert model[0] == "model" and model in app.tree_state.toggled
            await pilot.press("left")
            assert model not in app.tree_state.toggled
            await pilot.press("left")
            assert app.tree_state.selected == ("nc", 0)
            await pilot.press("left")  # collapse the core
            assert ("nc", 0) in app.tree_state.toggled
            await pilot.press("x")
            assert app.tree_state.all_collapsed is False and app.tree_state.toggled  # everything open
            await pilot.press("X")
            assert app.tree_state.all_collapsed and app.tree_state.selected == ("nd", 0)
    run(go())


def screen_text(app: NeuronTopApp) -> str:
    """What the terminal shows now, as plain text lines (dialogs over the main screen included)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def test_help_screen():
    for key, close in (("h", "escape"), ("question_mark", "q"), ("h", "h")):
        async def go(key=key, close=close):
            app = app_with(monitor_frame())
            async with app.run_test(size=(100, 40)) as pilot:
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, HelpScreen)
                text = screen_text(app)  # drawn, not an empty box (Textual 8 measured it as 0x0)
                assert "The real tool's keys" in text and "invert the sort order" in text
                assert app.screen.query_one("#help-text").region.width > 60
                await pilot.press(close)
                assert not isinstance(app.screen, HelpScreen) and not app._exit
        run(go())


@pytest.mark.parametrize("width", [80, 160])
def test_live_state_header_says_simulated(width):
    async def go():
        app = app_with(live_frame())
        async with app.run_test(size=(width, 30)) as pilot:
            await pilot.pause()
            header = screen_text(app).splitlines()[1]
            assert "Avg:  4.97%" in header and "sim" in header and "host" in header
    run(go())


def test_help_scrolls_at_80x24():
    async def go():
        app = app_with(monitor_frame())
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("h")
            await pilot.pause()
            text = screen_text(app)
            assert "The real tool's keys" in text and "Press Esc" not in text
            box = app.screen.query_one("#help-text").parent
            assert box.region.width <= 80 and box.region.height <= 24
            for _ in range(30):
                await pilot.press("down")
            await pilot.pause()
            assert "Press Esc, q or h to close" in screen_text(app)
    run(go())


def test_extras_toggle_and_focus():
    async def go():
        app = app_with(live_frame())
        async with app.run_test(size=(100, 30)) as pilot:  # narrow: extras hidden until v
            side = app.query_one("#side")
            assert not side.display or side.region.width == 0
            await pilot.press("v")
            assert app.screen.has_class("-extras") and app.query_one(ProcessList).has_focus
            assert app.query_one("#side").region.width > 0
            procs = app.query_one(ProcessList)
            await pilot.press("down")
            assert procs.cursor == 1
            await pilot.press("down")
            assert procs.cursor == 0  # wraps
            await pilot.press("v")
            assert app.query_one(MemoryTree).has_focus
        app = app_with(live_frame())
        async with app.run_test(size=(160, 50)) as pilot:  # wide: beside the main view; tab moves focus
            assert app.query_one("#side").region.width > 0
            await pilot.press("tab")
            assert app.query_one(ProcessList).has_focus
            await pilot.press("v")
            assert app.query_one("#side").region.width == 0
    run(go())


def row_of(app: NeuronTopApp, pid: int) -> int:
    """The row of ``pid`` in the (sorted) process table."""
    return [p.pid for p in app.query_one(ProcessList).rows].index(pid)


def test_signal_needs_a_target_and_confirmation(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def go():
            from tests.fixtures.top_frames import live_source
            source = live_source()
            frame = source.poll()
            # put the victim's pid on a recorded process so the table offers it
            from dataclasses import replace
            procs = tuple(replace(p, pid=victim.pid) if i == 0 else p for i, p in enumerate(frame.processes))
            app = app_with(replace(frame, processes=procs))
            async with app.run_test(size=(160, 50)) as pilot:
                await pilot.press("k")  # "all" tab, tree focused: no target
                assert not isinstance(app.screen, SignalScreen)
                await pilot.press("tab", *["down"] * row_of(app, victim.pid), "k")
                await pilot.pause()
                assert isinstance(app.screen, SignalScreen) and app.screen.pid == victim.pid
                text = screen_text(app)  # the question and the choices are on screen
                assert f"Send a signal to pid {victim.pid}?" in text and "t: TERM" in text
                await pilot.press("escape")  # cancel: nothing sent
                assert not app.signals_sent and victim.poll() is None
                await pilot.press("k", "n")
                assert not app.signals_sent
                await pilot.press("k", "t")
                await pilot.pause()
                assert app.signals_sent == [(victim.pid, signal.SIGTERM)]
        run(go())
        assert victim.wait(timeout=10) == -signal.SIGTERM
    finally:
        victim.kill()


def test_signal_by_tab_with_int_and_kill_choices():
    async def go():
        app = app_with(monitor_frame())  # pids from a stream: not on this host
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2", "k")
            assert isinstance(app.screen, SignalScreen) and "another host" in app.screen.warning
            await pilot.press("i")
            await pilot.pause()
            assert not app.signals_sent  # pid 48213 does not exist here: refused, reported
            await pilot.press("k", "9")
            await pilot.pause()
            assert not app.signals_sent
    if not __import__("psutil").pid_exists(48213):
        run(go())


def test_frames_from_the_collection_thread(tmp_path):
    async def go():
        from collectors.inventory import simulated
        source = LiveSource(simulated("trn1.32xlarge"), live_dir=tmp_path)
        app = NeuronTopApp(source, interval=0.05, version=VERSION)
        async with app.run_test(size=(100, 30)) as pilot:
            for _ in range(100):
                await pilot.pause(0.02)
                if app.frame.sequence >= 2:
                    break
            assert app.first_frame_shown and app.frame.sequence >= 2
            assert "no Neuron activity" in app.query_one("#util-header", Panel).data[0]
            status = app.query_one("#status", Panel)
            assert status.display
        assert app.collector is not None
    run(go())


def test_monitor_stream_errors_shown_and_kept_running(tmp_path):
    path = tmp_path / "stream.jsonl"
    good = MONITOR_STREAM.read_text().splitlines()[0]
    path.write_text(good + "\n{oops\n")

    async def go():
        app = NeuronTopApp(MonitorSource(str(path)), interval=0.05, version=VERSION)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(100):
                await pilot.pause(0.02)
                if app.frame.status.malformed:
                    break
            assert app.frame.status.malformed == 1 and len(app.frame.active) == 2
            with path.open("a") as f:  # the stream goes on: picked up
                f.write(good + "\n")
            for _ in range(100):
                await pilot.pause(0.02)
                if app.frame.status.reports == 2:
                    break
            assert app.frame.status.reports == 2
    run(go())


def test_unchanged_frames_cost_no_redraw():
    async def go():
        frame = monitor_frame()
        app = app_with(frame)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            title = app.query_one("#title", Panel)
            draws = title.draws
            app.apply_frame(frame)
            await pilot.pause()
            assert title.draws == draws
            assert not app.query_one("#mem-summary", Panel).show(app.query_one("#mem-summary", Panel).data)
    run(go())


def test_process_gone_falls_back_to_all():
    async def go():
        frame = monitor_frame()
        app = app_with(frame)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("3")
            assert app.tab_pid == 48990
            from dataclasses import replace
            app.apply_frame(replace(frame, sequence=9, processes=frame.processes[:1]))
            await pilot.pause()
            assert app.tab_pid is None
    run(go())


@pytest.mark.parametrize("size", [(20, 5), (40, 12), (60, 15), (79, 23), (300, 100)])
def test_any_terminal_size(size):
    async def go():
        for frame in (live_frame(), idle_frame()):
            app = app_with(frame)
            async with app.run_test(size=size) as pilot:
                await pilot.press("x", "f", "d", "down", "v", "down", "v")
                await pilot.resize_terminal(*reversed(size)) if hasattr(pilot, "resize_terminal") else None
                await pilot.pause()
                assert app.is_running
    run(go())


def test_no_activity_state_on_screen():
    async def go():
        app = app_with(idle_frame())
        async with app.run_test(size=(100, 30)):
            assert "no Neuron activity" in app.query_one("#util-header", Panel).data[0]
            assert tab_data(app.frame, None).utilization == {}
    run(go())


def test_first_poll_gives_a_frame_at_once(tmp_path):
    """The first poll has a frame (no previous sample needed) and asks no instance metadata service
    for a simulated instance; its time is measured by bench/tui.py, not asserted here (the charter:
    no wall-clock assertions)."""
    from collectors.inventory import simulated
    source = LiveSource(simulated("trn1.32xlarge"), live_dir=tmp_path)
    frame = source.poll()
    assert frame.sequence == 1 and frame.hardware.cores == 32 and frame.hardware.instance_id == ""


def _table_app_frame():
    from dataclasses import replace
    frame = live_frame()
    a, b = frame.processes
    c = replace(a, pid=4050, tag="4050", command="/work/main/.venv/bin/python /home/me/alpha.py",
                cores={8: CoreUse(8, 90.0, 0.0)}, core_memory={8: {"tensors": 1 << 40}}, models=())
    return replace(frame, processes=(a, b, c))


def test_sort_keys_reorder_the_process_table():
    async def go():
        app = app_with(_table_app_frame())
        async with app.run_test(size=(160, 50)) as pilot:
            procs = app.query_one(ProcessList)
            rows = lambda: [p.pid for p in procs.rows]  # noqa: E731
            assert rows() == [4050, 4100, 4110] and "PID▲" in screen_text(app)
            await pilot.press("I")
            assert rows() == [4110, 4100, 4050] and "PID▼" in screen_text(app)
            await pilot.press("P")  # NC%, largest first
            await pilot.pause()
            assert rows()[0] == 4050 and "NC%▼" in screen_text(app)
            await pilot.press("N", "greater_than_sign")  # next shown column after PID
            assert app.table_view.sort.value == procs_columns(procs)[1]
            await pilot.press("less_than_sign", "full_stop", "comma")
            assert app.table_view.sort.value == "PID"
            await pilot.press("M")
            assert rows()[0] == 4050
            await pilot.press("tab", "down", "k")  # the cursor is on a row of the sorted table
            assert isinstance(app.screen, SignalScreen) and app.screen.pid == rows()[1]
            await pilot.press("escape")
    run(go())


def procs_columns(procs: ProcessList) -> list[str]:
    from explorer.top.render import sort_columns
    return [k.value for k in sort_columns(procs.size.width)]


def test_filter_line_filters_and_keeps_keys_for_itself():
    async def go():
        app = app_with(_table_app_frame())
        async with app.run_test(size=(80, 24)) as pilot:  # narrow: / shows the table
            await pilot.press("slash")
            await pilot.pause()
            assert app.query_one("#filter").has_focus and app.query_one(ProcessList).region.width > 0
            await pilot.press("a", "l", "p", "h", "q", "1")  # typed, not help / quit / tab 1
            await pilot.pause()
            assert not app._exit and not isinstance(app.screen, HelpScreen)
            assert app.table_view.filter == "alphq1" and not app.query_one(ProcessList).rows
            await pilot.press("backspace", "backspace", "backspace", "enter")
            await pilot.pause()
            assert app.table_view.filter == "alp"
            assert [p.pid for p in app.query_one(ProcessList).rows] == [4050]
            assert not app.query_one("#filter").display  # closed, filter kept and shown
            assert 'Processes: 1 of 3 match "alp"' in screen_text(app)
            await pilot.press("slash", "escape")  # Esc clears
            await pilot.pause()
            assert app.table_view.filter == "" and len(app.query_one(ProcessList).rows) == 3
    run(go())


def test_stopped_process_on_the_main_screen_at_80x24():
    async def go():
        source = live_source()
        source._status_of = lambda pid: "stopped" if pid == 4110 else "sleeping"
        app = app_with(source.poll())
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            text = screen_text(app)
            assert "stopped (SIGSTOP): pid 4110" in text and "(stopped)" in text.splitlines()[-2]
    run(go())


def test_signal_dialog_stops_and_continues_a_process():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def go():
            from dataclasses import replace

            from explorer.top.live_source import process_status
            frame = live_frame()
            procs = tuple(replace(p, pid=victim.pid) if i == 0 else p for i, p in enumerate(frame.processes))
            app = app_with(replace(frame, processes=procs))
            async with app.run_test(size=(160, 50)) as pilot:
                await pilot.press("tab", *["down"] * row_of(app, victim.pid), "k", "s")
                await pilot.pause()
                assert app.signals_sent == [(victim.pid, signal.SIGSTOP)]
                for _ in range(100):
                    if process_status(victim.pid) == "stopped":
                        break
                    await pilot.pause(0.05)
                assert process_status(victim.pid) == "stopped"
                await pilot.press("k", "c")
                await pilot.pause()
                assert app.signals_sent[-1] == (victim.pid, signal.SIGCONT)
        run(go())
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_signal_dialog_wraps_at_80x24():
    """A long warning or command line is wrapped inside the dialog, not cut at the terminal's edge."""
    async def go():
        app = app_with(monitor_frame())
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("2", "k")
            await pilot.pause()
            text = screen_text(app)
            assert "another" in text and "host or namespace." in text and "Esc/n: cancel" in text
            assert app.screen.query_one("#signal-text").parent.region.width <= 80
            await pilot.press("escape")
    run(go())
