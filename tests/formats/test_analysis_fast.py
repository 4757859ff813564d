"""The analyses' fast path against their reference implementation (``tests/fixtures/analysis_reference``).

``formats.event_order`` builds the by-start and by-end orders from each row's own order (no global
sort), ``formats.critical_path`` finds predecessors with one forward sweep and every engine's gaps in
one pass, ``formats.breakdown`` takes all unions in one pass, and ``formats.depgraph`` reads parts on
a thread pool and groups DMA packets without DuckDB. Each must give exactly what the plain definition
gives: on hand-built random programs (ties in start and end, overlapping rows, rows out of id order,
several executions, edges that do and do not release, instructions of no known engine), on a
profile split into many parts with non-contiguous ids, and on the hand-built chain of
``test_analysis.py``'s docstring.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import breakdown, depgraph
from formats import critical_path as cp
from formats.depgraph import CC, DMA, INSTRUCTION, DepGraph
from formats.event_order import event_order, group_runs, merge_runs, natural_runs, sort_runs
from formats.reader import open_profile
from formats.schema import ENGINE_NAMES
from formats.writer import ProfileWriter
from tests.fixtures import analysis_reference as ref
from tests.fixtures.hand_profiles import HW, filled

ROWS = ["Tensor", "TensorMatrix", "Vector", "Scalar", "GpSimd", "Sync", "Odd"]  # "Odd": no known engine
QUEUES = ["qSyncIO0", "qSyncWeight1"]


def random_graph(seed: int, n_instr: int = 300, n_dma: int = 50, n_cc: int = 6, n_windows: int = 3,
                 n_edges: int = 400, shuffled: bool = True, time_ordered: bool = False) -> DepGraph:
    """A random program as a graph: each row runs in order on its own clock (small integer times, so
    starts and ends tie across rows; now and then an instruction overlaps its row's previous one),
    DMA transfers and collectives at random, random edges, executions split by host gaps."""
    rng = np.random.default_rng(seed)
    row = rng.integers(0, len(ROWS), n_instr)
    start = np.empty(n_instr, np.int64)
    clock = np.zeros(len(ROWS), np.int64)
    for i in range(n_instr):
        r = row[i]
        s = clock[r] + rng.integers(0, 4) - (2 if rng.random() < 0.05 else 0)
        start[i] = max(s, 0)
        clock[r] = start[i] + rng.integers(1, 6)
    end_i = start + rng.integers(1, 6, n_instr)
    if shuffled:  # rows out of id order: the fast path must sort such a row itself
        perm = rng.permutation(n_instr)
        row, start, end_i = row[perm], start[perm], end_i[perm]
    if time_ordered:  # ids in start order, as a writer in time order gives them: few natural runs
        perm = np.argsort(start, kind="stable")
        row, start, end_i = row[perm], start[perm], end_i[perm]
    span = int(end_i.max()) + 10
    d_start = np.sort(rng.integers(0, span, n_dma)) if time_ordered else rng.integers(0, span, n_dma)
    d_end = d_start + rng.integers(1, 40, n_dma)
    c_start = np.sort(rng.integers(0, span, n_cc)) if time_ordered else rng.integers(0, span, n_cc)
    c_end = c_start + rng.integers(5, 30, n_cc)
    lanes = ROWS + QUEUES + ["AllReduce"]
    engine = np.array([ENGINE_NAMES.index(name) if name in ENGINE_NAMES
                       else ENGINE_NAMES.index("Tensor") if name == "TensorMatrix" else -1
                       for name in ROWS], np.int8)
    s = np.concatenate([start, d_start, c_start])
    e = np.concatenate([end_i, d_end, c_end])
    n = s.size
    cuts = np.sort(rng.choice(np.arange(1, span), n_windows - 1, replace=False))
    bounds = np.concatenate([[0], cuts, [int(e.max()) + 5]])
    windows = np.stack([bounds[:-1], bounds[1:]], axis=1).astype(np.int64)
    src = rng.integers(0, n, n_edges)
    dst = rng.integers(0, n, n_edges)
    keep = src != dst
    return DepGraph(
        start=s, end=e,
        kind=np.concatenate([np.full(n_instr, INSTRUCTION, np.int8), np.full(n_dma, DMA, np.int8),
                             np.full(n_cc, CC, np.int8)]),
        ident=np.arange(n, dtype=np.int64),
        lane=np.concatenate([row, len(ROWS) + rng.integers(0, len(QUEUES), n_dma),
                             np.full(n_cc, len(lanes) - 1)]).astype(np.int32),
        engine=np.concatenate([engine[row], np.full(n_dma + n_cc, -1, np.int8)]),
        lanes=lanes, n_instr=n_instr, n_dma=n_dma, n_cc=n_cc,
        edge_src=src[keep].astype(np.int64), edge_dst=dst[keep].astype(np.int64), windows=windows,
        window_source="test", execution=np.maximum(np.searchsorted(windows[:, 0], s, side="right") - 1, 0)
        .astype(np.int32), flow_edges=int(keep.sum()))


def assert_same_as_reference(graph: DepGraph) -> None:
    order = event_order(graph)
    assert np.array_equal(order.by_start, np.argsort(graph.start, kind="stable"))
    assert np.array_equal(order.by_end, np.argsort(graph.end, kind="stable"))
    assert np.array_equal(order.prev_in_lane, ref.previous_in_lane(graph))
    rel = cp.release(graph)
    pred, implicit = ref.release(graph)
    assert np.array_equal(rel.pred, pred) and np.array_equal(rel.implicit, implicit)
    gaps = cp.idle_gaps(graph, rel)
    engine, g_start, g_end, waiter = ref.gaps(graph)
    assert np.array_equal(gaps.engine, engine) and np.array_equal(gaps.start, g_start)
    assert np.array_equal(gaps.end, g_end) and np.array_equal(gaps.waiter, waiter)
    assert [gaps.causes[c] for c in gaps.cause.tolist()] == ref.causes(graph, pred, engine, g_start, waiter)
    t = breakdown.temporal(graph, graph.device_time_ns)
    i, d, c, i_d, i_c, every = ref.temporal(graph)
    assert (t.compute_ns, t.dma_only_ns, t.collective_only_ns) == (i, i_d - i, every - i_d)
    assert t.dma_overlap == ((i + d - i_d) / d if d else None)
    assert t.collective_overlap == ((i + c - i_c) / c if c else None)


@pytest.mark.parametrize("seed", range(12))
def test_fast_path_equals_reference_on_random_programs(seed: int) -> None:
    assert_same_as_reference(random_graph(seed, shuffled=seed % 3 != 0, n_windows=1 + seed % 4))


@pytest.mark.parametrize("seed", range(4))
def test_fast_path_on_programs_written_in_time_order(seed: int) -> None:
    graph = random_graph(30 + seed, shuffled=False, time_ordered=True, n_windows=1 + seed)
    assert 0 < natural_runs(graph.start, 64).size - 1 <= 3  # the natural-runs merge is the one used
    assert_same_as_reference(graph)


def test_fast_path_without_edges_and_with_one_event_kind() -> None:
    assert_same_as_reference(random_graph(20, n_edges=0))
    assert_same_as_reference(random_graph(21, n_dma=0, n_cc=0, n_windows=1))


@pytest.mark.parametrize("seed", range(6))
def test_merged_runs_are_a_stable_argsort(seed: int) -> None:
    """Groups in index order, some ordered, some not, merged: exactly ``np.argsort(kind="stable")``;
    and the same from the index order's own non-decreasing stretches."""
    rng = np.random.default_rng(seed)
    n, k = 5000, 1 + 7 * seed
    kind = rng.integers(0, 3, n).astype(np.int8)
    lane = rng.integers(0, k, n).astype(np.int32)
    value = rng.integers(0, 50 + 1000 * (seed % 2), n).astype(np.int64)  # many ties when small
    if seed % 3 == 2:  # every group ordered: the groups are used as they are
        value = np.cumsum(rng.integers(0, 3, n)).astype(np.int64)
    ptr, idx, ordered, _ = group_runs(kind, lane, k, value, value)
    assert np.array_equal(idx, np.argsort(kind.astype(np.int64) * k + lane, kind="stable"))
    runs = sort_runs(idx.copy(), ptr, value, ordered)
    assert np.array_equal(merge_runs(runs, ptr, value), np.argsort(value, kind="stable"))
    for other in ((value * 7919) % 1009, np.arange(n)):  # the same groups re-sorted by another key
        _, _, other_ordered, _ = group_runs(kind, lane, k, other, other)
        again = sort_runs(runs.copy(), ptr, other, other_ordered & ordered)  # as event_order does
        assert np.array_equal(merge_runs(again, ptr, other), np.argsort(other, kind="stable"))
    stretches = np.concatenate([np.sort(part) for part in np.array_split(value, 1 + seed)])  # 1+seed runs
    natural = natural_runs(stretches, 64)
    assert natural.size - 1 <= 1 + seed
    assert np.array_equal(merge_runs(np.zeros(0, np.int64), natural, stretches),
                          np.argsort(stretches, kind="stable"))
    assert natural_runs(value, 4).size == 0 or seed % 3 == 2  # too many stretches: not used


# -- the loader: parts on a thread pool, DMA packets grouped without DuckDB, ids of every kind --------


def _split_profile(root: Path, seed: int) -> Path:
    """A profile in many small parts: instruction ids shuffled and sparse (a lookup table or a binary
    search maps Flow ids, not an offset), DMA packets out of transfer order with some queue names
    missing (``queue <idx>``) and transfers spread over parts, collectives, Flow edges of every kind
    including ones to rows that do not exist."""
    rng = np.random.default_rng(seed)
    n = 400
    graph = random_graph(seed, n_instr=n, n_dma=0, n_cc=0)
    stride = 1 if seed == 0 else (3 if seed == 1 else 10_000)
    ids = rng.permutation(n).astype(np.int64) * stride + 7
    packets = 120
    agg = rng.integers(0, 40, packets) * 5 + 1
    p_start = rng.integers(0, int(graph.end.max()), packets)
    names = [None if a % 3 == 0 or rng.random() < 0.2 else QUEUES[int(q)]  # a third of transfers unnamed
             for a, q in zip(agg.tolist(), rng.integers(0, 2, packets))]
    cc_ids = np.array([3, 1, 2], np.int64)
    in_table = ["instruction"] * 200 + ["dma_block"] * 30 + ["cc_op"] * 10 + ["semaphore"] * 5
    out_table = ["instruction"] * 150 + ["dma_block"] * 50 + ["cc_op"] * 20 + ["instruction"] * 25

    def pick(table: str) -> int:
        if table == "instruction":
            return int(rng.choice(ids)) if rng.random() < 0.95 else 999_999_999
        if table == "dma_block":
            return int(rng.choice(agg))
        return int(rng.choice(cc_ids))
    with ProfileWriter(root, {**HW, "first_hw_timestamp": 0, "last_hw_timestamp": int(graph.end.max()) + 50},
                       row_group_rows=64) as writer:
        writer.write("Instruction", filled("Instruction", {
            "start_ts": graph.start, "end_ts": graph.end, "id": ids,
            "engine": [ENGINE_NAMES[e] if e >= 0 else "Mystery" for e in graph.engine.tolist()],
            "timeline_track": pa.array([None if rng.random() < 0.1 else ROWS[r]
                                        for r in graph.lane.tolist()]),
            "hlo_name": pa.array([None if rng.random() < 0.1 else f"dot.{i % 7}" for i in range(n)]),
            "layer": [f"m/layers.{i % 3}/mlp" for i in range(n)],
            "raw_flops": pa.array([int(x) if x % 5 else None for x in rng.integers(0, 1000, n)], pa.int64()),
        }))
        writer.write("DmaPacket", filled("DmaPacket", {
            "start_ts": p_start, "end_ts": p_start + rng.integers(1, 50, packets), "id": np.arange(packets),
            "packet_aggregation_id": agg, "transfer_bytes": rng.integers(1, 100_000, packets),
            "queue_name": pa.array(names, pa.string()),
            "queue_idx": pa.array([int(q) if rng.random() < 0.8 else None
                                   for q in rng.integers(0, 4, packets)], pa.int64())}))
        writer.write("CcOp", filled("CcOp", {
            "start_ts": np.array([10, 40, 70]), "end_ts": np.array([30, 60, 90]), "op_id": cc_ids,
            "operation": ["AllReduce", "AllGather", "AllReduce"]}))
        src = [pick(t) for t in in_table]
        dst = [pick(t) for t in out_table]
        writer.write("Flow", {"in_table": in_table, "in_id": np.array(src), "out_table": out_table,
                              "out_id": np.array(dst), "dependency_type": ["SEMAPHORE"] * len(src)})
    return root


@pytest.mark.parametrize("seed", range(3))
def test_loader_on_split_parts_equals_the_plain_reading(tmp_path: Path, seed: int) -> None:
    root = _split_profile(tmp_path / "p", seed)
    profile = open_profile(root)
    assert len(profile.files("Instruction")) > 1 and len(profile.files("Flow")) > 1
    graph = depgraph.load_graph(profile)
    # instructions in id order, with their columns
    table = profile.table("Instruction", ["id", "start_ts", "end_ts"]).to_pydict()
    order = np.argsort(table["id"], kind="stable")
    assert np.array_equal(graph.ident[:graph.n_instr], np.array(table["id"])[order])
    assert np.array_equal(graph.start[:graph.n_instr], np.array(table["start_ts"])[order])
    # DMA transfers: as DuckDB groups them
    from formats import sqlsource

    with sqlsource.connect() as con:
        t_id, t_start, t_end, t_bytes, t_count, t_names = depgraph._transfers_sql(profile, con)
    lo, hi = graph.n_instr, graph.n_instr + graph.n_dma
    assert np.array_equal(graph.ident[lo:hi], t_id) and np.array_equal(graph.start[lo:hi], t_start)
    assert np.array_equal(graph.end[lo:hi], t_end) and np.array_equal(graph.dma_bytes, t_bytes)
    assert np.array_equal(graph.dma_packets, t_count)
    assert [graph.lanes[c] for c in graph.lane[lo:hi].tolist()] == t_names
    assert any(name.startswith("queue ") for name in t_names)
    # Flow edges: (table, id) looked up in plain dictionaries
    where = {(depgraph.KIND_NAMES[int(k)], int(i)): x
             for x, (k, i) in enumerate(zip(graph.kind.tolist(), graph.ident.tolist()))}
    flow = profile.table("Flow", ["in_table", "in_id", "out_table", "out_id"]).to_pylist()
    expected = [(where.get((f["in_table"], f["in_id"]), -1), where.get((f["out_table"], f["out_id"]), -1))
                for f in flow]
    expected = [(a, b) for a, b in expected if a >= 0 and b >= 0 and a != b]
    assert list(zip(graph.edge_src.tolist(), graph.edge_dst.tolist())) == expected
    assert graph.flow_edges == len(flow)
    assert_same_as_reference(graph)


def test_a_part_that_changed_after_opening_is_one_clear_error(tmp_path: Path) -> None:
    """Rows are placed by the footers read at open; a part rewritten since (another row count) is a
    ProfileError naming it, not rows silently misplaced."""
    from formats.reader import ProfileError

    root = _split_profile(tmp_path / "p", 0)
    profile = open_profile(root)
    part = profile.files("Instruction")[0]
    table = pq.read_table(part)
    pq.write_table(table.slice(0, table.num_rows - 1), part)
    with pytest.raises(ProfileError, match="changed while being read"):
        depgraph.load_graph(profile)
