"""``formats.figures`` and ``formats.units`` against hand-computed values (tests/fixtures/hand_profiles.py),
and the rule that the Summary is the whole-execution window."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats import figures as F
from formats import summary, units
from formats.reader import open_profile
from tests.fixtures.hand_profiles import PEAK, write_tiny

SAMPLES = Path(__file__).resolve().parents[2] / "sample_profiles"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return open_profile(write_tiny(tmp_path_factory.mktemp("fig") / "tiny"))


def test_whole_execution_figures_by_hand(tiny) -> None:
    f = F.figures(tiny)
    assert f.length_ns == 1000
    assert f.engines["Tensor"].busy_ns == 250  # union across both Tensor rows
    assert f.engines["Tensor"].fraction == pytest.approx(0.25)
    assert f.engines["Tensor"].instructions == 4 and f.engines["Tensor"].instruction_ns == 310
    assert {k: v.busy_ns for k, v in f.tracks.items()} == {"Tensor": 200, "TensorMatrix": 110, "Vector": 150}
    assert f.engines["Vector"].busy_ns == 150 and f.busiest is not None and f.busiest.name == "Tensor"
    assert (f.dma.packets, f.dma.bytes, f.dma.active_ns) == (2, 3000, 300)
    assert f.dma.throughput_bytes_per_s == pytest.approx(3000 / 1e-6)
    assert (f.hbm.read, f.hbm.write, f.hbm.source) == (1000, 2000, "DmaPacket")  # not the instructions' 0
    assert (f.flops.hardware, f.flops.transpose, f.flops.model) == (2500, 500, 2000)
    assert (f.collectives.count, f.collectives.time_ns, f.collectives.active_ns) == (1, 100, 100)
    assert f.active_ns == 600 and f.active_fraction == pytest.approx(0.6)
    assert f.mfu == pytest.approx(2000 / (PEAK * 1e-6))
    assert f.hfu == pytest.approx(2500 / (PEAK * 1e-6))
    assert f.mbu == pytest.approx(3000 / (410e9 * 1e-6))


def test_window_clips_time_and_counts_what_starts_in_it(tiny) -> None:
    f = F.figures(tiny, F.Window.span(50, 350))
    assert f.length_ns == 300
    assert f.engines["Tensor"].busy_ns == 150  # [50,150) ∪ [300,350)
    assert f.engines["Vector"].busy_ns == 0 and f.engines["Vector"].fraction == 0  # idle, still listed
    assert {k: v.busy_ns for k, v in f.tracks.items()} == {"Tensor": 100, "TensorMatrix": 100, "Vector": 0}
    assert (f.dma.packets, f.dma.bytes, f.dma.active_ns) == (1, 2000, 250)
    assert (f.hbm.read, f.hbm.write) == (0, 2000)
    assert (f.flops.hardware, f.flops.model) == (1000, 1000)  # the MATMUL starting at 50
    assert f.active_ns == 300 and f.collectives.count == 0
    # adjacent windows add up: amounts count what starts in each
    left, right = F.figures(tiny, F.Window.span(0, 500)), F.figures(tiny, F.Window.span(500, 1000))
    assert left.dma.bytes + right.dma.bytes == 3000
    assert left.engines["Tensor"].busy_ns + right.engines["Tensor"].busy_ns == 250
    assert (left.flops.hardware or 0) + (right.flops.hardware or 0) == 2500


def test_row_busy_selects_rows_or_engines(tiny) -> None:
    w = F.Window.span(0, 1000)
    assert F.row_busy(tiny, w, engines=["Tensor"]).busy_ns == 250
    assert F.row_busy(tiny, w, tracks=["TensorMatrix"]).busy_ns == 110
    assert F.row_busy(tiny, w, tracks=["Tensor", "Vector"]).busy_ns == 200 + 150 - 50  # one union
    assert F.row_busy(tiny, w, tracks=["Tensor"], pcore=1).busy_ns == 0


def test_summary_is_the_whole_execution_window(tiny) -> None:
    row = summary.stored_summary(tiny)
    assert row is not None
    scanned, stored = F.figures(tiny), F.from_summary(row, tiny.metadata)
    _same(scanned, stored)


@pytest.mark.parametrize("relative", ["llama-decode-tp2/device/model=llama_decode/core=1/execution=2",
                                      "bert-layer/device/model=bert_layer/core=0/execution=2"])
def test_sample_profiles_summary_equals_the_window_function(relative: str) -> None:
    path = SAMPLES / relative
    if not path.exists():
        pytest.skip("sample profile not present")
    profile = open_profile(path)
    row = summary.stored_summary(profile)
    assert row is not None
    _same(F.figures(profile), F.from_summary(row, profile.metadata))


def _same(scanned: F.Figures, stored: F.Figures) -> None:
    assert scanned.length_ns == pytest.approx(stored.length_ns, abs=1)
    # the Summary stores seconds as floats: a few ns of rounding on long profiles
    assert set(scanned.engines) == set(stored.engines)
    for name, busy in scanned.engines.items():
        assert busy.instructions == stored.engines[name].instructions
        assert busy.busy_ns == pytest.approx(stored.engines[name].busy_ns, rel=1e-9, abs=2)
    assert (scanned.dma.packets, scanned.dma.bytes) == (stored.dma.packets, stored.dma.bytes)
    assert scanned.dma.active_ns == pytest.approx(stored.dma.active_ns, rel=1e-9, abs=2)
    assert (scanned.hbm.read, scanned.hbm.write) == (stored.hbm.read, stored.hbm.write)
    assert scanned.flops == stored.flops
    assert scanned.collectives.count == stored.collectives.count
    assert scanned.collectives.active_ns == pytest.approx(stored.collectives.active_ns, rel=1e-9, abs=2)
    assert scanned.collectives.time_ns == pytest.approx(stored.collectives.time_ns, abs=1)
    assert scanned.active_ns == pytest.approx(stored.active_ns, rel=1e-9, abs=2)
    for name in ("mfu", "hfu", "mbu"):
        a, b = getattr(scanned, name), getattr(stored, name)
        assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, rel=1e-6)), name


def test_device_time_falls_back_to_the_event_span(tmp_path: Path) -> None:
    from tests.fixtures.hand_profiles import tiny_tables, write_profile

    tables = tiny_tables()
    del tables["ExecutionInfo"]
    profile = open_profile(write_profile(tmp_path / "noinfo", tables, summary=False))
    value, basis = F.device_time_ns(profile)
    assert value == 700.0 and basis != "ExecutionInfo"  # the span of what was recorded


# -- units -----------------------------------------------------------------------------------------


def test_sizes_are_binary_and_say_so() -> None:
    assert units.fmt_bytes(512) == "512 B"
    assert units.fmt_bytes(1536) == "1.5 KiB"
    assert units.fmt_bytes(332_000_000) == "316.6 MiB"
    assert units.fmt_bytes(1024 * 1024 - 1) == "1.0 MiB"  # never "1024.0 KiB"
    assert units.fmt_bytes(17.5 * 2**30, space=False) == "17.5GiB"
    assert units.fmt_bytes(None) == "-" and units.fmt_bytes(float("nan")) == "-"


def test_rates_are_decimal_gb_per_s() -> None:
    assert units.fmt_rate(2.5e10) == "25.0 GB/s"
    assert units.fmt_rate(3.3e8) == "330.0 MB/s"
    assert units.fmt_gbps(3.3e8) == "0.33 GB/s"
    assert units.fmt_rate(None) == "-"


def test_percentages_of_fractions() -> None:
    assert units.fmt_pct(0.316) == "31.6%"
    assert units.fmt_pct(0.0) == "0.0%"
    assert units.fmt_pct(0.0006) == "0.06%"  # a small model's MFU: not "0.1%" (+67 %)
    assert units.fmt_pct(0.0099) == "0.99%" and units.fmt_pct(0.01) == "1.0%"
    assert units.fmt_pct(0.0000002) == "<0.01%"  # not a misleading 0.00%
    assert units.fmt_pct(None) == "-"
    assert units.fmt_percent_value(9.3) == "9.3%"
    assert units.percent_cell(9.3) == " 9.30%" and units.percent_cell(99.999) == "  100%"


def test_durations_and_counts() -> None:
    assert units.fmt_ns(999) == "999 ns" and units.fmt_ns(1234) == "1.23 µs"
    assert units.fmt_ns(8.51e6) == "8.51 ms" and units.fmt_seconds(2.0) == "2 s"
    assert [units.fmt_count(n) for n in (9999, 15_234, 152_000, 999_600, 1_970_115, 197_011_509)] == \
        ["9999", "15.2k", "152k", "1.00M", "1.97M", "197M"]
    assert all(len(units.fmt_count(10 ** k + 7)) <= 5 for k in range(13))
    cells = units.count_cell(152_000, 4) + units.count_cell(1_970_115, 4) + units.count_cell(98, 4)
    assert cells.split() == ["152k", "1.97M", "98"]  # never run together
    assert units.fmt_flops(1.23e9) == "1.23 GFLOP" and units.fmt_flops_rate(1.9e14) == "190.00 TFLOP/s"


def test_busy_buckets_show_how_busy_each_pixel_is(tiny) -> None:
    # Tensor engine (both rows): [0,150) ∪ [300,400); 4 buckets of 250 ns over [0, 1000)
    for use_active_time in (True, False):
        b = F.busy_buckets(tiny, 0, 1000, 4, engines=["Tensor"], use_active_time=use_active_time)
        assert b.busy_ns.tolist() == [150.0, 100.0, 0.0, 0.0], b.source
        assert b.fraction.tolist() == [0.6, 0.4, 0.0, 0.0]
    assert F.busy_buckets(tiny, 0, 1000, 4, engines=["Tensor"]).source == "ActiveTime"
    rows = F.busy_buckets(tiny, 0, 1000, 4, tracks=["TensorMatrix"])
    assert rows.busy_ns.tolist() == [100.0, 10.0, 0.0, 0.0] and rows.source == "Instruction"
    # fractional buckets and a clipped window still add up to the row's busy time
    b = F.busy_buckets(tiny, 25, 375, 7, engines=["Tensor"])
    whole_row = F.row_busy(tiny, F.Window.span(25, 375), engines=["Tensor"])
    assert b.busy_ns.sum() == pytest.approx(whole_row.busy_ns)
    assert float(b.fraction.max()) <= 1.0


def test_two_physical_cores_add_up_in_every_busy_figure(tmp_path: Path) -> None:
    import numpy as np

    from tests.fixtures.hand_profiles import filled, write_profile

    tables = {"Instruction": filled("Instruction", {
        "start_ts": np.array([0, 0, 200]), "end_ts": np.array([100, 100, 300]),
        "engine": ["Tensor"] * 3, "timeline_track": ["TensorMatrix"] * 3, "opcode": ["MATMUL"] * 3,
        "id": np.arange(3), "pcore_idx": np.array([0, 1, 1])}),
        "ExecutionInfo": {"execution_index": np.array([0], np.int32), "execution_start_ts": [0],
                          "execution_end_ts": [1000]}}
    profile = open_profile(write_profile(tmp_path / "lnc2", tables))
    w = F.whole(profile)
    assert F.engine_busy(profile, w)["Tensor"].busy_ns == 300  # Σ over cores: 100 + (100 + 100)
    assert F.track_busy(profile, w)["TensorMatrix"].busy_ns == 300
    assert F.row_busy(profile, w, engines=["Tensor"]).busy_ns == 300
    assert F.row_busy(profile, w, engines=["Tensor"], pcore=1).busy_ns == 200
    assert summary.stored_summary(profile)["tensor_engine_active_time"] == pytest.approx(300e-9)
    for use_active_time in (True, False):
        b = F.busy_buckets(profile, 0, 1000, 10, engines=["Tensor"], use_active_time=use_active_time)
        assert b.busy_ns.tolist() == [200.0, 0.0, 100.0] + [0.0] * 7, b.source
    assert F.busy_buckets(profile, 0, 1000, 10, engines=["Tensor"], pcore=0).busy_ns.sum() == 100
    rows = [F.RowSelect("t", engines=("Tensor",))]
    cov = F.busy_rows(profile, 0, 1000, 10, rows, use_active_time=False)["t"]
    assert cov.fraction.mean() == pytest.approx(F.engine_busy(profile, w)["Tensor"].fraction)


def test_dma_counts_name_transfers_and_packets_in_every_view() -> None:
    """The headline said "1360 packets" where the viewer said "85 transfers" for one profile: both
    now show one text, from DmaFigures.count_text."""
    from explorer.viewer.summary_figures import figures as panel_figures
    from formats.headline import Program, headline_lines

    path = SAMPLES / "bert-layer/device/model=bert_layer/core=0/execution=2"
    if not path.exists():
        pytest.skip("sample profile not present")
    profile = open_profile(path)
    row = summary.stored_summary(profile)
    assert row is not None
    dma = F.from_summary(row, profile.metadata).dma
    assert dma.transfers and dma.packets > dma.transfers
    counts = units.fmt_count(dma.transfers), units.fmt_count(dma.packets)
    assert dma.count_text == f"{counts[0]} transfers ({counts[1]} packets)"
    panel = {f.label: f.value for f in panel_figures(row)}
    assert panel["DMA moved"].endswith(dma.count_text)
    assert F.DmaFigures(5, 10, 0, 1.0, None).count_text == "5 packets"
    assert F.DmaFigures(0, 10, 0, 1.0, 3).count_text == "3 transfers"
    headline = "\n".join(headline_lines(Program("bert", profile, row)))
    assert f"in {dma.count_text}," in headline
