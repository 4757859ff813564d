"""Pictures of neuron-top (pytest-textual-snapshot): our live state and a neuron-monitor stream, at
80x24 and 160x50, plus the "no Neuron activity" and bad-stream states.

Inputs are fixed (``tests/fixtures/top_frames.py``: a recording, a stream file, a frozen host and
clock), and no collection thread runs, so the pictures are the same on every machine. After a
deliberate change: ``pytest tests/explorer/test_top_snapshots.py --snapshot-update`` and look at the
SVGs before committing them.
"""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from explorer.top.monitor_source import MonitorSource
from explorer.top.top_app import NeuronTopApp
from tests.fixtures.top_frames import (
    MONITOR_STREAM,
    VERSION,
    idle_frame,
    live_frame,
    live_source,
    monitor_frame,
)

SIZES = [(80, 24), (160, 50)]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_state(snap_compare, size):
    assert snap_compare(NeuronTopApp(frame=live_frame(), version=VERSION), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_monitor_stream(snap_compare, size):
    assert snap_compare(NeuronTopApp(frame=monitor_frame(), version=VERSION), terminal_size=size)


def test_live_state_tab_flops_and_tree(snap_compare):
    """A process tab, TFLOPS mode, a core selected (highlighted in the grid, engines shown)."""
    app = NeuronTopApp(frame=live_frame(), version=VERSION)
    assert snap_compare(app, terminal_size=(160, 50), press=["3", "f", "down", "down", "down"])


def test_no_activity(snap_compare):
    assert snap_compare(NeuronTopApp(frame=idle_frame(), version=VERSION), terminal_size=(80, 24))


def test_bad_stream(snap_compare):
    good = MONITOR_STREAM.read_text().splitlines()[0]
    source = MonitorSource("stream.jsonl", io.StringIO(good + "\n{not json\n"), clock=lambda: 1.0)
    frame = source.poll()
    frame = replace(frame, status=replace(frame.status, ended=True, message="stream.jsonl ended after 1 "
                                          "reports; showing the last one"))
    assert snap_compare(NeuronTopApp(frame=frame, version=VERSION), terminal_size=(120, 40))


@pytest.mark.parametrize("size", [(80, 24), (100, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_help(snap_compare, size):
    """The help box with its text (Textual 8 drew it as an empty 4x2 box)."""
    assert snap_compare(NeuronTopApp(frame=monitor_frame(), version=VERSION), terminal_size=size,
                        press=["h"])


def test_signal_dialog(snap_compare):
    """The signal dialog with its question and choices (it was an empty 4x2 box that took keys)."""
    assert snap_compare(NeuronTopApp(frame=monitor_frame(), version=VERSION), terminal_size=(100, 30),
                        press=["2", "k"])


def test_stopped_process_sorted_by_memory(snap_compare):
    """A SIGSTOPped process (STATE, tab and status line), the table sorted by DEV MEM (``M``)."""
    source = live_source()
    source._status_of = lambda pid: "stopped" if pid == 4110 else "sleeping"
    app = NeuronTopApp(frame=source.poll(), version=VERSION)
    assert snap_compare(app, terminal_size=(160, 50), press=["M"])
