"""``TrackViewport.engine_window`` (one engine, longest event per pixel bucket, from the events or the
stored ``InstructionLod``) and the interval unions behind the summary."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from formats import lod as lods
from formats.intervals import UnionAccumulator, time_slices
from formats.reader import open_profile
from formats.tracks import INSTRUCTION_ENGINES, TrackViewport
from formats.writer import ProfileWriter
from tests.fixtures.hand_profiles import HW
from tests.fixtures.recorded import Recorded


def brute_window(start: np.ndarray, end: np.ndarray, t0: int, t1: int, buckets: int
                 ) -> dict[int, int]:
    """bucket -> longest duration among events overlapping [t0, t1), bucketed by (clamped) start."""
    keep = (start < t1) & (end > t0)
    s, e = start[keep], end[keep]
    bucket = np.clip((s - t0) * buckets // (t1 - t0), 0, buckets - 1)
    out: dict[int, int] = {}
    for b, d in zip(bucket.tolist(), (e - s).tolist()):
        out[b] = max(out.get(b, 0), d)
    return out


@pytest.mark.parametrize("buckets", [7, 200, 2000])
def test_raw_window_is_the_longest_per_bucket(recorded: Recorded, buckets: int) -> None:
    profile = open_profile(recorded.path)
    instr = profile.table("Instruction", ["engine", "start_ts", "end_ts", "id"])
    vector = instr.filter(pc.equal(instr.column("engine"), "Vector"))
    start, end = vector.column("start_ts").to_numpy(), vector.column("end_ts").to_numpy()
    t0, t1 = int(start.min()) + 500, int(np.median(end))
    view = TrackViewport(profile)
    window = view.span_windows(INSTRUCTION_ENGINES, t0, t1, buckets, keys=[("Vector",)])[("Vector",)]
    view.close()
    expected = brute_window(start, end, t0, t1, buckets)
    assert dict(zip(window.bucket.tolist(), window.duration_ns.tolist())) == expected
    assert len(window) <= buckets and window.source == "events"
    ids = set(vector.column("id").to_pylist())
    assert set(window.id.tolist()) <= ids
    assert int(window.count.sum()) == int(((start < t1) & (end > t0)).sum())


def test_engine_window_uses_the_lod_when_zoomed_out(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    assert profile.num_rows(lods.LOD_TABLE) > 0  # written when the capture closed
    first, last = profile.metadata["first_hw_timestamp"], profile.metadata["last_hw_timestamp"]
    view = TrackViewport(profile)
    wide = view.engine_window("tensor", first, last, 50)  # any spelling of the engine
    assert wide.source.startswith("lod level")
    spellings = [k.key for k in view.span_keys(INSTRUCTION_ENGINES) if k.key[0] == "Tensor"]
    raw = view.span_windows(INSTRUCTION_ENGINES, first, last, 50, keys=spellings)[("Tensor",)]
    # same events to draw: every LOD pick is a real Tensor instruction; totals agree
    instr = profile.table("Instruction", ["engine", "id", "start_ts", "end_ts"])
    tensor = instr.filter(pc.equal(instr.column("engine"), "Tensor"))
    by_id = dict(zip(tensor.column("id").to_pylist(), zip(tensor.column("start_ts").to_pylist(),
                                                         tensor.column("end_ts").to_pylist())))
    for i, s, e in zip(wide.id.tolist(), wide.start_ts.tolist(), wide.end_ts.tolist()):
        assert by_id[i] == (s, e)
    assert int(wide.count.sum()) == tensor.num_rows == int(raw.count.sum())
    assert max(wide.duration_ns) == max(raw.duration_ns)
    assert all(isinstance(o, str) for o in wide.attrs["opcode"])
    narrow = view.engine_window("Tensor", first, first + 2_000, 2000)  # zoomed in: instructions
    assert narrow.source == "events"
    matrix = view.engine_window("TensorMatrix", first, last, 100)  # a timeline row, not an engine
    assert matrix.source == "events" and set(matrix.id.tolist()) <= set(by_id)
    view.close()


def test_lod_is_built_for_profiles_without_one(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    built = lods.build_lod(profile)
    stored = profile.table(lods.LOD_TABLE)
    assert built.num_rows == stored.num_rows
    assert built.column("id").to_pylist() == stored.column("id").to_pylist()
    view = TrackViewport(profile)
    with pytest.raises(ValueError, match="empty window"):
        view.engine_window("Tensor", 10, 10)
    view.close()


def test_time_slices_follow_row_group_statistics(tmp_path: Path) -> None:
    with ProfileWriter(tmp_path / "p", HW, row_group_rows=1000, encoder_threads=1) as writer:
        n = 10_000
        start = np.arange(n, dtype=np.int64) * 10
        writer.write("HbmUsage", {"timestamp": start, "current_throughput": np.ones(n, np.float32),
                                  "total_transfer_bytes": np.arange(n)})
    files = sorted((tmp_path / "p").glob("HbmUsage*.parquet"))
    slices = time_slices(files, "timestamp", rows_per_slice=3000)
    assert slices[0][0] is None and slices[-1][1] is None and len(slices) == 4
    assert [b for _, b in slices[:-1]] == [30_000, 60_000, 90_000]
    assert sum(pq.read_metadata(f).num_rows for f in files) == n


def test_union_accumulator_against_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 50))
        s = np.sort(rng.integers(0, 300, n))
        e = s + rng.integers(0, 40, n)
        k = rng.integers(0, 3, n)
        cuts = sorted(set(rng.integers(0, 300, int(rng.integers(0, 5))).tolist()))
        edges = [None, *cuts, None]
        acc = UnionAccumulator(keep_segments=True)
        for lo, hi in itertools.pairwise(edges):
            sel = np.ones(n, bool)
            if lo is not None:
                sel &= s >= lo
            if hi is not None:
                sel &= s < hi
            if sel.any():
                acc.add(k[sel], s[sel], e[sel])
        keys, seg_s, seg_e = acc.segments()
        for key in range(3):
            covered = np.zeros(400, bool)
            for a, b in zip(s[k == key], e[k == key]):
                covered[a:b] = True
            assert acc.lengths().get(key, 0) == int(covered.sum())
            mine = keys == key
            assert int((seg_e[mine] - seg_s[mine]).sum()) == int(covered.sum())
