"""One captured profile, every view, the same figures (docs/figures.md).

The profile is ``sample_profiles/llama-decode-tp2`` rank 0 (a two-layer Llama decode step on one of two
trn1 cores, timing only: both Tensor rows, DMA, collectives, stacks). The truth is ``formats.figures``
over the whole execution and ``formats.attribution``; each view must report the same values, exactly
where it passes numbers on and within its display rounding where it prints them:

* summary-json and summary-text (``neuron-profile view``),
* the terminal viewer's data layer (``explorer.viewer.data``: summary panel, engine bars, strip,
  tree and source lines),
* the GUI's data layer (``explorer.gui``: region summary over the whole range, row busy fractions,
  zoomed-out row shading, the Summary tab/compare figures, source lines),
* the Perfetto export, parsed back (tracks' slices, DMA transfer bytes, HLO op busy time, counters),
* neuron-top's formatting and aggregation (the same units for the same inputs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from formats import figures as F
from formats import summary, units
from formats.attribution import attribute
from formats.intervals import union_length
from formats.profile_commands import main
from formats.reader import open_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE = (ROOT / "sample_profiles" / "llama-decode-tp2" / "device" / "model=llama_decode" / "core=0"
           / "execution=2")
FRACTION = 1e-6  # the Summary stores *_percent as float32: ~7 significant digits

pytestmark = pytest.mark.skipif(not PROFILE.exists(), reason="sample profile not present")


@pytest.fixture(scope="module")
def profile():
    return open_profile(PROFILE)


@pytest.fixture(scope="module")
def truth(profile):
    return F.figures(profile)


@pytest.fixture(scope="module")
def attributed(profile):
    return attribute(profile)


@pytest.fixture(scope="module")
def span(profile) -> tuple[int, int]:
    meta = profile.metadata
    return int(meta["first_hw_timestamp"]), int(meta["last_hw_timestamp"])


# -- summary-json / summary-text ---------------------------------------------------------------


def test_summary_json_is_the_whole_execution_window(truth, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(PROFILE), "--output-format", "summary-json"]) == 0
    row = next(iter(json.loads(capsys.readouterr().out).values()))
    stored = F.from_summary(row)
    assert stored.length_ns == pytest.approx(truth.length_ns, abs=1)
    for name, busy in truth.engines.items():
        assert row[f"{name.lower()}_engine_active_time_percent"] == pytest.approx(busy.fraction, rel=FRACTION)
    assert row["dma_active_time_percent"] == pytest.approx(truth.dma.active_fraction, rel=FRACTION)
    assert (row["hbm_read_bytes"], row["hbm_write_bytes"]) == (truth.hbm.read, truth.hbm.write)
    assert row["dma_transfer_total_bytes"] == truth.dma.bytes
    assert row["model_flops"] == truth.flops.model and row["hardware_flops"] == truth.flops.hardware
    for key, value in (("mfu_estimated_percent", truth.mfu), ("hfu_estimated_percent", truth.hfu),
                       ("mbu_estimated_percent", truth.mbu)):
        assert row[key] == pytest.approx(value, rel=1e-6), key
    assert row["cc_op_count"] == truth.collectives.count
    assert row["cc_op_active_time_percent"] == pytest.approx(truth.collectives.active_fraction, rel=FRACTION)


def test_summary_text_headline(truth, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(PROFILE), "--output-format", "summary-text"]) == 0
    head = capsys.readouterr().out.split("-- full table")[0]
    assert f"device time     {units.fmt_ns(truth.length_ns)}" in head
    assert f"MFU {units.fmt_pct(truth.mfu)}" in head and f"MBU {units.fmt_pct(truth.mbu)}" in head
    top = truth.busiest
    assert top is not None and f"busiest engine  {top.name} {units.fmt_pct(top.fraction)}" in head
    for name, busy in truth.engines.items():
        assert f"{name} {units.fmt_pct(busy.fraction)}" in head
    assert f"{units.fmt_bytes(truth.dma.bytes)} in " in head  # "N transfers (M packets)"
    assert f"({units.fmt_count(truth.dma.packets)} packets)" in head or (
        f"in {units.fmt_count(truth.dma.packets)} packets" in head)
    assert f"{units.fmt_gbps(truth.dma.throughput_bytes_per_s)} average" in head
    assert f"{units.fmt_bytes(truth.hbm.read)} read, {units.fmt_bytes(truth.hbm.write)} written" in head
    assert f"{truth.collectives.count} ops, {units.fmt_ns(truth.collectives.time_ns)}" in head


# -- the terminal viewer -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def viewer(profile):
    from explorer.viewer.data import ProfileData

    data = ProfileData(profile, "llama")
    yield data
    data.close()


def test_viewer_summary_panel(viewer, truth) -> None:
    overview = viewer.overview()
    shown = {f.label: f.value for f in overview.figures}
    assert shown["Total time"] == units.fmt_ns(truth.length_ns)
    assert shown["MFU"] == units.fmt_pct(truth.mfu)
    assert shown["HFU"] == units.fmt_pct(truth.hfu)
    assert shown["MBU"] == units.fmt_pct(truth.mbu)
    assert shown["HBM moved"] == units.fmt_bytes(truth.hbm.total)
    assert shown["DMA moved"].startswith(units.fmt_bytes(truth.dma.bytes))
    bars = dict(overview.engine_active)
    for name, busy in truth.engines.items():
        assert bars[name] == pytest.approx(busy.fraction, rel=FRACTION), name
    assert bars["DMA"] == pytest.approx(truth.dma.active_fraction, rel=FRACTION)


def test_viewer_strip_is_exact_occupancy(viewer, profile, span) -> None:
    t0, t1 = span
    strip = viewer.timeline(t0, t1, 80)
    window = F.Window.span(t0, t1)
    tracks = F.track_busy(profile, window)
    tensor = F.engine_busy(profile, window)["Tensor"]
    for row in strip.rows:
        expected = tracks.get(row.engine)
        if row.engine.startswith("Tensor") and expected is None:
            expected = tensor  # the engine's union row
        if expected is None:
            continue
        assert row.busy == pytest.approx(expected.fraction, abs=1e-9), row.engine
        assert float(np.mean(row.occupancy)) == pytest.approx(expected.fraction, abs=1e-9), row.engine


def test_viewer_tree_and_source_lines(viewer, attributed) -> None:
    analysis = viewer.analyse(viewer.overview())
    nodes = analysis.hierarchy.nodes
    layers = {n.layer: n for n in nodes.values() if n.kind == "layer"}
    assert set(layers) == set(attributed.layers)
    for path, layer in attributed.layers.items():
        assert layers[path].stats.time_ns == layer.inclusive_ns, path
    ops = {str(n.hlo_ref[1]): n for n in nodes.values() if n.kind == "hlo" and n.hlo_ref is not None}
    assert set(ops) == set(attributed.ops)
    for key, op in attributed.ops.items():
        assert ops[key].stats.time_ns == op.inclusive_ns, op.name
    lines = analysis.source.lines
    assert lines, "the sample profile has stacks"
    for (file, number), stat in lines.items():  # a line's time is the tree's time of the ops under it
        mine = attributed.lines.get((file, number))
        assert mine is not None, (file, number)
        assert stat.time_ns == mine.inclusive_ns, (file, number)


def test_viewer_problems_are_summary_texts(viewer, profile, truth, attributed) -> None:
    from formats.findings import find

    analysis = viewer.analyse(viewer.overview())
    mine = find(profile, truth, attributed)
    assert [p.title for p in analysis.problems] == [f.title for f in mine]
    ops = {o.key: o.name for o in attributed.ops.values()}
    for shown, finding in zip(analysis.problems, mine):
        if shown.node and shown.node.startswith("H:") and finding.op:
            assert ops[shown.node[2:]] == finding.op, finding.title  # the same biggest op


# -- the GUI ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gui():
    from explorer.gui.rows import discover_rows
    from explorer.gui.session import open_session

    session = open_session([PROFILE])
    yield session, discover_rows(session)
    session.close()


def test_gui_region_summary_over_the_whole_range(gui, profile, span) -> None:
    from explorer.gui.region import as_text, region_summary
    from explorer.gui.rows import INSTRUCTION

    session, rows = gui
    loaded = session.profiles[0]
    t0, t1 = span
    instr = [r for r in rows if r.kind == INSTRUCTION]
    summary_ = region_summary(loaded, instr, t0, t1)
    window = F.Window.span(t0, t1)
    expected = F.figures(profile, window)
    per_row, unions = summary_.busy[:len(instr)], summary_.busy[len(instr):]
    for row, busy in zip(instr, per_row):  # each boxed row: its timeline row's busy figure
        want = expected.tracks[row.track or row.label]
        assert busy.busy_ns == want.busy_ns and busy.fraction == pytest.approx(want.fraction), busy.name
    assert unions, "the Tensor engine's union is listed where both of its rows are boxed"
    for busy in unions:
        assert busy.busy_ns == expected.engines["Tensor"].busy_ns, busy.name
    device = summary_.device
    assert device is not None
    assert device.hbm.read == expected.hbm.read and device.hbm.read > 0  # not the instructions' 0 B
    assert (device.dma.bytes, device.dma.packets) == (expected.dma.bytes, expected.dma.packets)
    assert device.mfu == pytest.approx(expected.mfu)
    text = dict(as_text(summary_, loaded.origin))
    assert any(units.fmt_bytes(expected.hbm.read) in v for v in text.values())
    # the whole range holds the whole execution's amounts: the same as the Summary's
    truth = F.figures(profile)
    assert (device.dma.bytes, device.hbm.read, device.flops.model) == \
        (truth.dma.bytes, truth.hbm.read, truth.flops.model)


def test_gui_rows_zoomed_out_show_how_busy(gui, profile, span) -> None:
    from explorer.gui.rows import INSTRUCTION

    session, rows = gui
    loaded = session.profiles[0]
    t0, t1 = span
    tracks = F.track_busy(profile, F.Window.span(t0, t1))
    for row in rows:
        if row.kind != INSTRUCTION:
            continue
        windows = loaded.tracks.span_windows(row.spec, t0, t1, 400, row.keys)
        busy = [w.busy for w in windows.values() if w.busy is not None]
        assert busy, row.label
        shading = np.minimum(1.0, np.sum(busy, axis=0))
        want = tracks[row.label].fraction
        assert float(shading.mean()) == pytest.approx(want, abs=0.005), row.label  # 0.5 %: a pixel's shade
        assert float(shading.max()) <= 1.0


def test_gui_source_lines(gui, attributed) -> None:
    from explorer.gui.source_times import load_source_times

    session, _ = gui
    times = load_source_times(session.profiles[0])
    assert times.lines
    for (file, number), line in times.lines.items():
        mine = attributed.lines[(file, number)]
        assert (line.inclusive_ns, line.self_ns) == (mine.inclusive_ns, mine.self_ns), (file, number)


def test_gui_flame_graph_nodes(gui, attributed) -> None:
    from explorer.gui.flame_tree import load_flame_tree

    session, _ = gui
    tree = load_flame_tree(session.profiles[0])
    layers = {n.name: n for n in tree.nodes if n.kind == "layer"}
    assert set(layers) == set(attributed.layers)
    for path, layer in attributed.layers.items():
        node = layers[path]
        spans = int((node.intervals[:, 1] - node.intervals[:, 0]).sum())
        shown = node.active_ns if node.active_ns is not None else spans
        assert shown == layer.inclusive_ns, path
    ops = {str(n.raw_id): n for n in tree.nodes if n.kind == "hlo" and n.raw_id is not None}
    for key, op in attributed.ops.items():
        if key in ops and ops[key].active_ns is not None:
            assert ops[key].active_ns == op.inclusive_ns, op.name


def test_gui_compare_figures(gui, truth) -> None:
    from explorer.gui import compare

    session, _ = gui
    loaded = session.profiles[0]
    shown = compare.profile_figures(loaded)
    assert shown.mfu == pytest.approx(truth.mfu, rel=FRACTION)
    assert {k: b.busy_ns for k, b in shown.engines.items()} == \
        pytest.approx({k: b.busy_ns for k, b in truth.engines.items()}, abs=2)
    rows = {r.metric: r for r in compare.summary_deltas(loaded, loaded)}
    assert rows and all(r.delta in (0, None) for r in rows.values())
    mfu = next(r for r in rows.values() if r.metric.startswith("MFU"))
    assert mfu.a == pytest.approx(truth.mfu, rel=FRACTION)


# -- the Perfetto export ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory, profile):
    from formats.trace_export import write_trace
    from tests.fixtures.perfetto_trace import read_trace

    path = tmp_path_factory.mktemp("perfetto") / "trace.pftrace"
    with open(path, "wb") as out:
        write_trace([("llama", profile)], out)
    return read_trace(path)


def test_perfetto_tracks_match_the_figures(trace, truth, attributed) -> None:
    def on(name: str) -> list[Any]:
        return [s for s in trace.slices if re.fullmatch(rf"{re.escape(name)}( #\d+)?", s.track)]

    for name, busy in truth.tracks.items():
        mine = on(name)
        assert len(mine) == busy.instructions, name
        starts = np.array([s.ts for s in mine])
        assert union_length(starts, starts + np.array([s.dur for s in mine])) == busy.busy_ns, name
    transfers = [s for s in trace.slices if s.track.startswith("q")]
    assert sum(int(s.args["bytes"]) for s in transfers) == truth.dma.bytes
    ops = on("HLO ops")
    assert ops and all("active_time_ns" in s.args for s in ops)
    op_times = {o.name: o.inclusive_ns for o in attributed.ops.values()}
    for s in ops:
        assert int(s.args["active_time_ns"]) == op_times[s.name], s.name
    layers = on("Layers")
    assert layers and {s.name for s in layers} <= {p.rpartition("/")[2] for p in attributed.layers}
    assert trace.counters.get("DMA throughput (bytes/s)", 0) > 0 or any("DMA" in k for k in trace.counters)


# -- neuron-top --------------------------------------------------------------------------------------


def test_neuron_top_prints_the_same_units() -> None:
    from explorer.top import fmt

    for n in (0, 512, 1536, 332_000_000, 17.5 * 2**30):
        assert fmt.size(n) == units.fmt_bytes(n, space=False)
    for rate in (3.3e8, 2.5e10):
        assert fmt.rate(rate) == units.fmt_rate(rate, space=False)
    for value in (0.72, 9.3, 56.81, 99.999):
        assert fmt.percent(value) == units.percent_cell(value)


def test_neuron_top_engine_busy_is_the_fraction_of_time(profile) -> None:
    """neuron-top's per-engine busy (live state) is a fraction in [0, 1] combined per core like the
    Summary's (Σ over processes, capped at 1), shown with the same percent formatting."""
    from explorer.top.aggregate import combine
    from explorer.top.snapshots import CoreUse, ProcessSnapshot

    busy = {name: b.fraction for name, b in F.engine_busy(profile, F.whole(profile)).items()}
    snapshot = ProcessSnapshot(1, "llama", cores={0: CoreUse(0, 100 * busy["Vector"], 0.0, engine_busy=busy)})
    data = combine([snapshot])
    assert dict(data.engine_busy[0]) == pytest.approx(busy)


def test_stored_summary_is_what_every_view_read(profile, truth) -> None:
    row = summary.stored_summary(profile)
    assert row is not None
    stored = F.from_summary(row, profile.metadata)
    assert {k: v.busy_ns for k, v in stored.engines.items()} == \
        pytest.approx({k: v.busy_ns for k, v in truth.engines.items()}, abs=2)
