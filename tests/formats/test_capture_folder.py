"""A capture's top folder (``out/bert`` holding ``device/`` and ``system/``) opened where a user
names it, and timeline windows of any width: both crashed the GUI with ``Overflow in multiplication
of INT64`` (the system profile's host clock mixed into the device timeline), each test failed before
its fix."""

from __future__ import annotations

import subprocess
import sys

import duckdb
import numpy as np
import pytest

from formats.dataset import device_entries, find_profiles
from formats.lod import bucket_of, bucket_sql
from formats.reader import open_profile
from formats.tracks import DMA_QUEUES, HBM_THROUGHPUT, INSTRUCTION_TRACKS, TrackViewport
from tests.fixtures.samples import BERT, REPO

CAPTURE = BERT.parent  # sample_profiles/bert-layer: device/ + system/
WIDE = [(0, 2 * 10**18), (-(10**18), 10**18), (-(2**62), 2**62)]


def _exact(offsets: list[int], width: int, buckets: int) -> list[int]:
    return [min(buckets - 1, max(0, o * buckets // width)) for o in offsets]


@pytest.mark.parametrize("width", [7, 10**6, 4 * 10**15, 2 * 10**18, 2**63 - 1])
def test_bucket_of_is_exact_at_any_width(width: int) -> None:
    offsets = [-(2**62), -5, -1, 0, 1, width // 3, width // 2, width - 1, width, 2**62]
    for buckets in (1, 702, 2000):
        expected = _exact(offsets, width, buckets)
        assert bucket_of(np.array(offsets, np.int64), width, buckets).tolist() == expected
        con = duckdb.connect()
        sql = bucket_sql("o", width, buckets)
        got = [r[0] for r in con.execute(f"SELECT {sql} FROM (SELECT unnest(?::BIGINT[]) AS o)",
                                         [offsets]).fetchall()]
        con.close()
        assert got == expected


@pytest.mark.parametrize("t0,t1", WIDE)
def test_track_windows_of_any_width_do_not_overflow(t0: int, t1: int) -> None:
    profile = open_profile(find_profiles(BERT)[0][0].path)
    view = TrackViewport(profile)  # no level of detail built yet: the raw aggregate answers
    try:
        spans = view.span_windows(INSTRUCTION_TRACKS, t0, t1, 702)
        dma = view.span_windows(DMA_QUEUES, t0, t1, 702)
        counters = view.counter_windows(HBM_THROUGHPUT, t0, t1, 702)
    finally:
        view.close()
    first = int(profile.metadata["first_hw_timestamp"])
    expected = _exact([first - t0], t1 - t0, 702)[0]
    assert spans and dma and counters
    assert {int(w.bucket[0]) for w in spans.values()} == {expected}  # the profile is < 1 bucket wide
    assert sum(int(w.count.sum()) for w in spans.values()) == profile.num_rows("Instruction")


def test_device_entries_split_a_capture_folder() -> None:
    entries, _ = find_profiles(CAPTURE)
    devices, systems = device_entries(entries)
    assert [e.name for e in systems] == ["system"]
    assert devices and all(e.name.startswith("device/") for e in devices)
    assert open_profile(systems[0].path).is_system and not open_profile(devices[0].path).is_system


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "explorer.profile_cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def test_cli_views_of_a_capture_folder_show_its_device_profile() -> None:
    """summary-text and analyze on the capture folder equal the same on its device/ folder; the
    system profile is named once on stderr."""
    top = _cli("view", str(CAPTURE), "--output-format", "summary-text")
    device = _cli("view", str(BERT), "--output-format", "summary-text")
    assert top.returncode == device.returncode == 0, top.stderr
    assert top.stdout.replace("device/", "") == device.stdout
    assert top.stderr.count("system profile (host side)") == 1 and "Traceback" not in top.stderr
    analyzed = _cli("analyze", str(CAPTURE))
    assert analyzed.returncode == 0 and "Traceback" not in analyzed.stderr, analyzed.stderr
    alone = _cli("view", str(CAPTURE / "system"))
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1, alone.stderr
    assert "system (host-side) profile only" in alone.stderr


def test_viewer_of_a_capture_folder_lists_device_profiles_only(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The TUI listed the system profile as a second, empty "device" profile (all dashes)."""
    from explorer.profile_cli import main
    from explorer.viewer import view_command
    from explorer.viewer.viewer_app import ViewerApp

    ran: list[ViewerApp] = []
    monkeypatch.setattr(view_command, "is_terminal", lambda: True)
    monkeypatch.setattr(ViewerApp, "run", lambda self: ran.append(self))
    assert main(["view", str(CAPTURE)]) == 0
    assert [e.name for e in ran[0].entries] == [e.name for e in find_profiles(CAPTURE)[0]][:1]
    assert all(e.name.startswith("device/") for e in ran[0].entries)
    assert "system profile (host side)" in capsys.readouterr().err
    assert main(["view", str(CAPTURE / "system")]) == 2
    assert "system (host-side) profile only" in capsys.readouterr().err
