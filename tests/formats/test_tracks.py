"""``formats.tracks`` over ``formats.lod``: span windows (raw and LOD) against brute force, counters' min/max,
keys, the one tie-break rule, and the viewport's thread rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from formats import lod as lods
from formats import tracks
from formats.figures import busy_per_bucket
from formats.reader import open_profile
from formats.sqlsource import TableSource
from formats.writer import ProfileWriter
from tests.fixtures.hand_profiles import HW

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "sample_profiles/llama-decode-tp2/device/model=llama_decode/core=0/execution=2"


def brute(start: np.ndarray, end: np.ndarray, ids: np.ndarray, t0: int, t1: int, buckets: int
          ) -> dict[int, tuple[int, int, int]]:
    """bucket -> (longest duration, its id (ties: larger id), events overlapping the window there)."""
    keep = (start < t1) & (end > t0)
    out: dict[int, tuple[int, int, int]] = {}
    for s, e, i in zip(start[keep].tolist(), end[keep].tolist(), ids[keep].tolist()):
        b = min(buckets - 1, max(0, (s - t0) * buckets // (t1 - t0)))
        d, best, n = out.get(b, (-1, -1, 0))
        if (e - s, i) > (d, best):
            d, best = e - s, i
        out[b] = (d, best, n + 1)
    return out


@pytest.fixture(scope="module")
def llama() -> tracks.TrackViewport:
    view = tracks.TrackViewport(open_profile(LLAMA))
    yield view
    view.close()


@pytest.mark.parametrize("buckets", [5, 300, 4000])
def test_raw_span_windows_are_the_longest_per_bucket(llama: tracks.TrackViewport, buckets: int) -> None:
    table = llama.profile.table("Instruction", ["start_ts", "end_ts", "id", "timeline_track", "opcode"])
    track = np.asarray(table.column("timeline_track").to_pylist(), dtype=object)
    start, end = table.column("start_ts").to_numpy(), table.column("end_ts").to_numpy()
    ids = table.column("id").to_numpy()
    t0, t1 = int(start.min()) + 3000, int(np.median(end))
    windows = llama.span_windows(tracks.INSTRUCTION_TRACKS, t0, t1, buckets)
    assert {k[1] for k in windows} == set(track.tolist())
    for key, window in windows.items():
        mine = track == key[1]
        expected = brute(start[mine], end[mine], ids[mine], t0, t1, buckets)
        assert window.source == "events"
        got = {int(b): (int(d), int(i), int(n)) for b, d, i, n in
               zip(window.bucket, window.duration_ns, window.id, window.count)}
        assert got == expected
        opcodes = dict(zip(ids.tolist(), table.column("opcode").to_pylist()))
        assert list(window.attrs["opcode"]) == [opcodes[int(i)] for i in window.id]


def test_lod_agrees_with_the_events_when_zoomed_out(llama: tracks.TrackViewport) -> None:
    spec = tracks.DMA_QUEUES
    first = int(llama.profile.metadata["first_hw_timestamp"])
    last = int(llama.profile.metadata["last_hw_timestamp"])
    raw = llama.span_windows(spec, first, last, 50)
    lod = llama.lod(spec)
    assert lod is not None and lod.finest * lods.LOD_PER_PIXEL <= (last - first) / 50
    assert llama.lod_serves(spec, first, last, 50)
    served = llama.span_windows(spec, first, last, 50)
    assert set(served) == set(raw)
    for key in raw:
        assert served[key].source.startswith("lod level")
        assert int(served[key].count.sum()) == int(raw[key].count.sum())  # every packet counted once
        assert served[key].duration_ns.max() == raw[key].duration_ns.max()
        assert len(served[key]) <= 50


def test_lod_built_in_slices_equals_one_pass(tmp_path: Path) -> None:
    profile = open_profile(_many_row_groups(tmp_path / "groups"))
    whole = tracks.build_span_lod(profile, tracks.INSTRUCTION_TRACKS)
    sliced = tracks.build_span_lod(profile, tracks.INSTRUCTION_TRACKS, rows_per_slice=1000)
    assert whole is not None and sliced is not None and whole.widths == sliced.widths
    assert whole.levels.keys() == sliced.levels.keys()
    for key, levels in whole.levels.items():
        for a, b in zip(levels, sliced.levels[key]):
            for name in ("bucket_ts", "start_ts", "end_ts", "id", "count"):
                assert np.array_equal(a[name], b[name]), name
    assert lods.lod_buckets(10) == lods.LOD_BUCKETS
    assert lods.lod_buckets(10**10) == lods.LOD_MAX_BUCKETS
    assert lods.LOD_BUCKETS < lods.lod_buckets(2 * 10**6) < lods.LOD_MAX_BUCKETS


def _many_row_groups(path: Path) -> Path:
    """20k instructions on two tracks in 1000-row groups (so the build has many slices)."""
    rng = np.random.default_rng(5)
    n = 20_000
    start = np.sort(rng.integers(0, 5_000_000, n))
    end = start + rng.integers(10, 900, n)
    with ProfileWriter(path, HW, row_group_rows=1000) as writer:
        writer.write("Instruction", {
            "start_ts": start, "end_ts": end, "duration_ns": end - start,
            "engine": pa.array(["Tensor"] * n),
            "timeline_track": pa.array(["Tensor", "TensorMatrix"] * (n // 2)),
            "opcode": pa.array(["MATMUL"] * n), "operands": pa.array([""] * n),
            "id": np.arange(n, dtype=np.int64), "pc": np.arange(n, dtype=np.int64),
            "bir_id": pa.array(["sg0000:0"] * n),
        })
    return path


def test_quick_instruction_lod_from_the_engine_lod(llama: tracks.TrackViewport) -> None:
    profile = llama.profile
    keys = llama.span_keys(tracks.INSTRUCTION_TRACKS)
    quick = tracks.quick_instruction_lod(profile, keys)
    assert quick is not None and set(quick.levels) == {k.key for k in keys}
    table = profile.table("Instruction", ["start_ts", "end_ts", "id", "timeline_track"])
    track = np.asarray(table.column("timeline_track").to_pylist(), dtype=object)
    start, end = table.column("start_ts").to_numpy(), table.column("end_ts").to_numpy()
    ids = table.column("id").to_numpy()
    first, last = int(start.min()), int(end.max())
    for key in quick.levels:
        window = quick.window(key, first, last + 1, 40)
        assert window is not None and window.source.startswith("lod level")
        mine = track == key[1]
        assert int(window.count.sum()) == int(mine.sum())  # every instruction of the row counted once
        assert window.duration_ns.max() == (end - start)[mine].max()
        assert set(window.id.tolist()) <= set(ids[mine].tolist())
        assert all(isinstance(o, str) for o in window.attrs["opcode"])
    view = tracks.TrackViewport(profile)
    view.install_lod(tracks.INSTRUCTION_TRACKS, quick)
    assert view.lod_serves(tracks.INSTRUCTION_TRACKS, first, last, 40)
    assert not view.has_full_lod(tracks.INSTRUCTION_TRACKS)
    view.close()


def test_counter_windows_min_max_last(llama: tracks.TrackViewport) -> None:
    table = llama.profile.table("HbmUsage", ["timestamp", "current_throughput"])
    ts = table.column("timestamp").to_numpy()
    value = table.column("current_throughput").to_numpy().astype(float)
    t0, t1, buckets = int(ts[10]), int(ts[-10]), 7
    window = llama.counter_windows(tracks.HBM_THROUGHPUT, t0, t1, buckets)[(0,)]
    inside = (ts >= t0) & (ts < t1)
    bucket = (ts[inside] - t0) * buckets // (t1 - t0)
    for b, lo, hi, last in zip(window.bucket, window.low, window.high, window.last):
        mine = value[inside][bucket == b]
        assert lo == pytest.approx(mine.min()) and hi == pytest.approx(mine.max())
        assert last == pytest.approx(mine[-1])
    assert window.before == pytest.approx(value[9])
    assert window.samples == int(inside.sum())
    assert llama.counter_range(tracks.HBM_THROUGHPUT) == pytest.approx((value.min(), value.max()))


def test_windowed_counters_say_how_long_a_sample_holds(llama: tracks.TrackViewport) -> None:
    keys = llama.counter_keys(tracks.NEURONLINK_THROUGHPUT)
    assert keys and all(n > 0 for _, n in keys)
    table = llama.profile.table("NeuronLinkUsage", ["timestamp", "duration_ns"])
    t0 = int(table.column("timestamp").to_numpy().min())
    windows = llama.counter_windows(tracks.NEURONLINK_THROUGHPUT, t0, t0 + 100_000, 100)
    for window in windows.values():
        assert window.until is not None and (window.until > 0).all()


def _odd_profile(path: Path) -> Path:
    """Two spellings of one engine and no timeline_track: what a real profile may hold."""
    start = np.array([0, 100, 250, 400, 420, 900], np.int64)
    end = start + np.array([50, 120, 10, 300, 30, 60], np.int64)
    with ProfileWriter(path, HW) as writer:
        writer.write("Instruction", {
            "start_ts": start, "end_ts": end, "duration_ns": end - start,
            "engine": pa.array(["tensor", "Tensor", "PE", "Vector", "tensor", "Vector"]),
            "opcode": pa.array(["MATMUL"] * 6), "operands": pa.array([""] * 6),
            "id": np.arange(6, dtype=np.int64), "pc": np.arange(6, dtype=np.int64),
            "bir_id": pa.array([f"sg0000:{i}" for i in range(6)]),
        })
    return path


def test_raw_keys_merge_into_one_row(tmp_path: Path) -> None:
    profile = open_profile(_odd_profile(tmp_path / "odd"))
    view = tracks.TrackViewport(profile)
    keys = view.span_keys(tracks.INSTRUCTION_TRACKS)
    tensor = [k.key for k in keys if k.key[2] in ("tensor", "Tensor", "PE")]
    assert len(tensor) == 3 and sum(k.rows for k in keys) == 6
    windows = view.span_windows(tracks.INSTRUCTION_TRACKS, 0, 1000, 10, keys=tensor)
    merged = tracks.merge_windows([windows[k] for k in tensor])
    assert dict(zip(merged.bucket.tolist(), merged.id.tolist())) == {0: 0, 1: 1, 2: 2, 4: 4}
    assert int(merged.count.sum()) == 4
    source = TableSource(profile, "Instruction")
    condition = tracks.key_condition(source, tracks.INSTRUCTION_TRACKS.keys, tensor[:1])
    assert "IS NULL" in condition  # no timeline_track column: its key part is null
    assert tracks.key_condition(source, tracks.INSTRUCTION_TRACKS.keys, None) == "true"
    highlighted = view.span_windows(tracks.INSTRUCTION_TRACKS, 0, 1000, 10, keys=tensor, where="id >= 2")
    assert sorted(int(i) for w in highlighted.values() for i in w.id) == [2, 4]
    view.close()


def test_absent_tables_have_no_rows(tmp_path: Path) -> None:
    view = tracks.TrackViewport(open_profile(_odd_profile(tmp_path / "odd")))
    assert view.span_keys(tracks.CC_STREAMS) == []
    assert view.span_windows(tracks.DMA_QUEUES, 0, 100, 10) == {}
    assert view.counter_windows(tracks.PSUM_USAGE, 0, 100, 10) == {}
    assert view.counter_range(tracks.SBUF_USAGE) is None
    assert tracks.build_span_lod(view.profile, tracks.CC_STREAMS) is None
    with pytest.raises(ValueError, match="empty window"):
        view.span_windows(tracks.INSTRUCTION_TRACKS, 10, 10, 5)
    view.close()


# -- busy time per pixel -------------------------------------------------------------------------


def _union_per_bucket(start: np.ndarray, end: np.ndarray, t0: int, t1: int, buckets: int) -> np.ndarray:
    """Brute force: per pixel bucket, the length of the union of the intervals inside it / its width."""
    order = np.argsort(start, kind="stable")
    merged: list[list[int]] = []
    for s, e in zip(start[order].tolist(), end[order].tolist()):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    edges = t0 + np.arange(buckets + 1) * ((t1 - t0) / buckets)
    out = np.zeros(buckets)
    for s, e in merged:
        out += np.clip(np.minimum(e, edges[1:]) - np.maximum(s, edges[:-1]), 0, None)
    return out / np.diff(edges)


@pytest.mark.parametrize("buckets", [7, 300, 5000])
def test_busy_fraction_from_the_events_is_exact(llama: tracks.TrackViewport, buckets: int) -> None:
    table = llama.profile.table("Instruction", ["start_ts", "end_ts", "timeline_track"])
    track = np.asarray(table.column("timeline_track").to_pylist(), dtype=object)
    start, end = table.column("start_ts").to_numpy(), table.column("end_ts").to_numpy()
    t0, t1 = int(start.min()) + 3001, int(np.median(end))
    windows = llama.span_windows(tracks.INSTRUCTION_TRACKS, t0, t1, buckets)
    for key, window in windows.items():
        mine = track == key[1]
        expected = _union_per_bucket(start[mine], end[mine], t0, t1, buckets)
        got = window.busy
        assert got is not None
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=str(key))


def test_busy_fraction_from_the_lod_is_within_a_bucket(llama: tracks.TrackViewport) -> None:
    spec = tracks.INSTRUCTION_TRACKS
    table = llama.profile.table("Instruction", ["start_ts", "end_ts", "timeline_track"])
    track = np.asarray(table.column("timeline_track").to_pylist(), dtype=object)
    start, end = table.column("start_ts").to_numpy(), table.column("end_ts").to_numpy()
    first, last = int(start.min()), int(end.max())
    view = tracks.TrackViewport(llama.profile)
    lod = view.lod(spec)
    assert lod is not None
    for t0, t1, buckets in ((first, last, 60), (first + (last - first) // 3, last - (last - first) // 5, 90)):
        assert view.lod_serves(spec, t0, t1, buckets)
        windows = view.span_windows(spec, t0, t1, buckets)
        for key, window in windows.items():
            assert window.source.startswith("lod level")
            mine = track == key[1]
            expected = _union_per_bucket(start[mine], end[mine], t0, t1, buckets)
            got = window.busy
            assert got is not None
            # each level-of-detail bucket's busy time lands in one pixel: at most a bucket off per pixel
            level = int(window.source.rsplit(" ", 1)[1])
            tolerance = 2 * lod.widths[level] / ((t1 - t0) / buckets)
            assert np.abs(got - expected).max() <= tolerance + 1e-9, key
            assert abs(got.sum() - expected.sum()) <= 0.02 * max(1.0, expected.sum()) + tolerance, key
    view.close()


def test_a_thirty_percent_busy_row_never_looks_solid(tmp_path: Path) -> None:
    """300 ns busy in every 1000 ns: zoomed out, every pixel is about 30 % busy (not 100 %)."""
    n = 200_000
    start = np.arange(n, dtype=np.int64) * 1000
    end = start + 300
    with ProfileWriter(tmp_path / "p", HW) as writer:
        writer.write("Instruction", {
            "start_ts": start, "end_ts": end, "duration_ns": end - start,
            "engine": pa.array(["Vector"] * n), "timeline_track": pa.array(["Vector"] * n),
            "opcode": pa.array(["TENSOR_COPY"] * n), "operands": pa.array([""] * n),
            "id": np.arange(n, dtype=np.int64), "pc": np.arange(n, dtype=np.int64),
            "bir_id": pa.array(["sg0000:0"] * n),
        })
    view = tracks.TrackViewport(open_profile(tmp_path / "p"))
    t0, t1 = 0, int(end[-1])
    raw = view.span_windows(tracks.INSTRUCTION_TRACKS, t0, t1, 1000)
    view.lod(tracks.INSTRUCTION_TRACKS)
    served = view.span_windows(tracks.INSTRUCTION_TRACKS, t0, t1, 1000)
    for window in (*raw.values(), *served.values()):
        busy = window.busy
        assert busy is not None
        assert np.all(np.abs(busy - 0.3) < 0.05), (window.source, busy.min(), busy.max())
    view.close()


def test_merged_windows_keep_busy_time() -> None:
    a = tracks.SpanWindow(np.array([0, 2]), np.array([0, 20]), np.array([5, 25]), np.array([1, 2]),
                          np.array([1, 1]), {}, "events", np.array([0.5, 0.0, 0.5, 0.0]))
    b = tracks.SpanWindow(np.array([1]), np.array([10]), np.array([35]), np.array([3]),
                          np.array([1]), {}, "events", np.array([0.0, 1.0, 0.5, 1.0]))
    merged = tracks.merge_windows([a, b])
    np.testing.assert_allclose(merged.busy, [0.5, 1.0, 1.0, 1.0])
    none = tracks.SpanWindow(a.bucket, a.start_ts, a.end_ts, a.id, a.count, {}, "lod")
    assert tracks.merge_windows([a, none]).busy is None


def test_busy_per_bucket_spreads_coarse_buckets_and_run_ons() -> None:
    # a 4 ns bucket at 6 with 2 ns covered straddles pixels [0, 8) and [8, 16); one at 16 holds an
    # event running to 40
    busy = busy_per_bucket(np.array([6, 16]), 4, np.array([2, 4]), np.array([10, 40]), 0, 48, 6)
    np.testing.assert_allclose(busy, [1 / 8, 1 / 8, 1.0, 1.0, 1.0, 0.0])


def test_busy_per_pixel_is_the_row_busy_figure(llama: tracks.TrackViewport) -> None:
    """The timeline's busy bars show ``formats.figures``' row busy with the pixel as the window
    (computed here from the windows' own aggregates, there by sweeping the instructions)."""
    from formats.figures import RowSelect, busy_rows

    table = llama.profile.table("Instruction", ["start_ts", "end_ts"])
    start, end = table.column("start_ts").to_numpy(), table.column("end_ts").to_numpy()
    t0, t1, buckets = int(start.min()) + 1234, int(end.max()) - 999, 700
    windows = llama.span_windows(tracks.INSTRUCTION_TRACKS, t0, t1, buckets)
    rows = [RowSelect(str(key[1]), tracks=(str(key[1]),)) for key in windows]
    expected = busy_rows(llama.profile, t0, t1, buckets, rows)
    for key, window in windows.items():
        assert window.source == "events"
        np.testing.assert_allclose(window.busy, expected[str(key[1])].fraction, atol=1e-9, err_msg=str(key))


# -- one tie-break rule ----------------------------------------------------------------------------


def _ties_profile(path: Path) -> Path:
    """Per 1000 ns, two Vector instructions with the same start and end (ids 3k, written first, and
    3k+1) and a shorter one (3k+2): every reader must draw 3k+1 (``formats.lod.rank``: the longest,
    ties to the larger id), whatever the row order."""
    n = 3000
    base = np.arange(n, dtype=np.int64) * 1000
    start = np.stack([base, base, base + 500], axis=1).reshape(-1)
    end = np.stack([base + 300, base + 300, base + 600], axis=1).reshape(-1)
    ids = np.arange(3 * n, dtype=np.int64)
    m = start.size
    with ProfileWriter(path, HW) as writer:
        writer.write("Instruction", {
            "start_ts": start, "end_ts": end, "duration_ns": end - start,
            "engine": pa.array(["Vector"] * m), "timeline_track": pa.array(["Vector"] * m),
            "opcode": pa.array(["TENSOR_COPY"] * m), "operands": pa.array([""] * m),
            "id": ids, "pc": ids, "bir_id": pa.array(["sg0000:0"] * m),
        })
    return path


def test_every_reader_breaks_ties_to_the_larger_id(tmp_path: Path) -> None:
    profile = open_profile(_ties_profile(tmp_path / "ties"))
    losers = set((np.arange(3000) * 3).tolist())  # as long as 3k+1, same start, smaller id
    view = tracks.TrackViewport(profile)
    t1 = 3000 * 1000
    raw = view.span_windows(tracks.INSTRUCTION_TRACKS, 0, t1, 3000)  # a pixel per period
    assert {w.source for w in raw.values()} == {"events"}
    assert set(next(iter(raw.values())).id.tolist()) == set((np.arange(3000) * 3 + 1).tolist())
    built = view.lod(tracks.INSTRUCTION_TRACKS)
    stored = lods.lod_from_table(lods.build_lod(profile))  # what a capture's close writes
    assert built is not None and stored is not None
    for lod in (built, stored):
        for level in next(iter(lod.levels.values())):
            assert level["id"].size and not set(level["id"].tolist()) & losers
    wide = view.engine_window("Vector", 0, t1, 30)  # from the (built) stored table
    assert wide.source.startswith("lod level") and not set(wide.id.tolist()) & losers
    assert int(wide.count.sum()) == 9000
    merged = tracks.merge_windows([raw[k] for k in raw] * 2)  # merging picks by the same rank
    assert not set(merged.id.tolist()) & losers
    # the rank in NumPy and in SQL is one rule
    assert lods.rank(np.array([300, 300]), np.array([7, 9])).argmax() == 1
    assert f"* {lods.TIE}" in lods.rank_sql("d", "i")
    view.close()


# -- thread rules ----------------------------------------------------------------------------------


def test_one_viewport_answers_many_threads_at_once(llama: tracks.TrackViewport) -> None:
    """A UI thread, a fetch thread and a level-of-detail thread share one ``TrackViewport``: windows,
    keys, counters and LOD builds run concurrently and answer what one thread alone gets."""
    import threading

    profile = llama.profile
    first = int(profile.metadata["first_hw_timestamp"])
    last = int(profile.metadata["last_hw_timestamp"])
    windows = [(first, last, 50), (first + (last - first) // 3, first + (last - first) // 2, 700),
               (first + 1000, first + 40_000, 300)]

    def snapshot(view: tracks.TrackViewport) -> list[object]:
        out: list[object] = []
        for spec in (tracks.INSTRUCTION_TRACKS, tracks.DMA_QUEUES):
            out.append([k.key for k in view.span_keys(spec)])
            for t0, t1, n in windows:
                for key, w in sorted(view.span_windows(spec, t0, t1, n).items(), key=lambda kv: str(kv[0])):
                    out.append((key, w.source.split(" ")[0], w.bucket.tolist(), w.id.tolist(),
                                int(w.count.sum())))
        for t0, t1, n in windows:
            w = view.engine_window("Tensor", t0, t1, n)
            out.append((w.source.split(" ")[0], w.id.tolist()))
            counters = view.counter_windows(tracks.HBM_THROUGHPUT, t0, t1, n)
            out.append({k: c.high.tolist() for k, c in counters.items()})
        return out

    reference_view = tracks.TrackViewport(profile)
    reference_view.lod(tracks.INSTRUCTION_TRACKS)
    reference_view.lod(tracks.DMA_QUEUES)
    reference = snapshot(reference_view)
    reference_view.close()

    shared = tracks.TrackViewport(profile)
    errors: list[BaseException] = []
    results: list[list[object]] = []
    start = threading.Barrier(6)

    def run(job: object) -> None:
        try:
            start.wait()
            assert callable(job)
            job()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    def builder(spec: tracks.SpanSpec) -> object:
        return lambda: shared.lod(spec)

    def reader() -> None:
        for _ in range(2):
            snapshot(shared)

    threads = [threading.Thread(target=run, args=(job,)) for job in
               (builder(tracks.INSTRUCTION_TRACKS), builder(tracks.DMA_QUEUES),
                builder(tracks.INSTRUCTION_TRACKS),
                lambda: shared.install_quick_lod(tracks.INSTRUCTION_TRACKS), reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[0]
    assert shared.has_full_lod(tracks.INSTRUCTION_TRACKS) and shared.has_full_lod(tracks.DMA_QUEUES)
    results.append(snapshot(shared))  # full LODs in place: exactly what one thread alone answers
    assert results[0] == reference
    shared.install_lod(tracks.INSTRUCTION_TRACKS, tracks.quick_instruction_lod(
        profile, shared.span_keys(tracks.INSTRUCTION_TRACKS)) or tracks.SpanLod(0, [1]))
    assert shared.lod(tracks.INSTRUCTION_TRACKS) is not None
    assert snapshot(shared) == reference  # a full level of detail is never replaced by a quick one
    shared.close()
