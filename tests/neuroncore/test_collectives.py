"""Collective timing model (neuroncore.collectives) against hand-computed cases (neuroncore.md §6).

Expected times are derived here from the ring/mesh step structure and the link figures of §1.4, not
from the implementation: a step costs its hop latency plus its bytes over the slowest share of a link.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuroncore import collectives as cc
from neuroncore.topology import EFA, NEURONLINK, ON_CHIP, instance_topology

GIB = 2**30
MIB = 2**20
L_NS = 1_500.0  # intra-node hop latency (§6: 1-2 us)
L_ON_CHIP_NS = 1_300.0  # one DMA transfer's fixed cost (§5.1)
INF2_LINK = 96 * GIB  # bytes/s per direction: 192 GiB/s per chip over 2 links (§1.4)
TRN1_LINK = 96e9  # 384 GB/s per chip over 4 links (§1.4)
ON_CHIP_BPS = 272e9  # 16 DMA engines x 17 B/ns (§5.1)


def ns(seconds: float) -> float:
    return seconds * 1e9


@pytest.fixture(scope="module")
def inf2():
    return instance_topology("inf2.48xlarge")


@pytest.fixture(scope="module")
def trn1():
    return instance_topology("trn1.32xlarge")


# -- rings by hand -------------------------------------------------------------------------------


def test_8_rank_single_ring_all_reduce(inf2):
    # core 0 of devices 0..7 of the inf2 ring of 12; one ring. Each of the 2(r-1) steps every rank
    # sends S / r to the next; hops 0->1 .. 6->7 use one link each and the closing 7 -> 0 goes on
    # round through devices 8..11: every link direction carries one flow. The latency is per hop
    # (§6), so each step lasts as long as the closing flow's 5 hops.
    r, size = 8, 8 * MIB
    ranks = [2 * d for d in range(r)]
    rec = cc.all_reduce(inf2, ranks, size // 4, "fp32", params=cc.CollectiveParams(max_rings=1))
    expected = 2 * (r - 1) * (5 * L_NS + ns(size / r / INF2_LINK))
    assert rec.algorithm == "Ring" and rec.rings == 1 and rec.steps == 2 * (r - 1)
    assert rec.duration_ns == pytest.approx(expected)
    assert rec.link_usage.step_flows.max() == 1
    assert {c.kind for c in rec.channel_bytes()} == {NEURONLINK}


def test_full_inf2_all_reduce_uses_both_ring_directions(inf2):
    # 24 ranks; the ring runs both ways with half the data each. Every step each device sends
    # S / (24 x 2) over each of its two outgoing link directions; the on-chip hop (272 GB/s) is faster.
    r, size = 24, 64 * MIB
    rec = cc.all_reduce(inf2, range(r), size // 4, "fp32")
    assert rec.rings == 2
    assert rec.duration_ns == pytest.approx(2 * (r - 1) * (L_NS + ns(size / (r * 2) / INF2_LINK)))


def test_trn1_ring_all_gather_and_reduce_scatter(trn1):
    # the torus' two link-disjoint Hamiltonian cycles, each both ways: 4 rings over 4 x 96 GB/s
    r = 32
    gathered = cc.all_gather(trn1, range(r), MIB, "bf16")  # 2 MiB in per rank, 64 MiB out
    s_in = 2 * MIB
    assert gathered.rings == 4 and gathered.steps == r - 1
    assert gathered.output_bytes == r * s_in
    assert gathered.duration_ns == pytest.approx((r - 1) * (L_NS + ns(s_in / 4 / TRN1_LINK)))
    scattered = cc.reduce_scatter(trn1, range(r), 16 * MIB, "fp32")  # 64 MiB in per rank
    s_in = 64 * MIB
    assert scattered.output_bytes == s_in // r
    assert scattered.duration_ns == pytest.approx((r - 1) * (L_NS + ns(s_in / r / 4 / TRN1_LINK)))


def test_large_all_reduce_approaches_the_link_bound(trn1):
    rec = cc.all_reduce(trn1, range(32), 512 * MIB // 2, "bf16")
    bound = trn1.neuronlink_egress_bytes_per_s(0)
    assert bound == pytest.approx(4 * TRN1_LINK)
    assert 0.9 * bound < rec.busbw_bytes_per_s < bound


def test_ring_link_bytes(trn1):
    # every directed NeuronLink channel belongs to exactly one of the 4 rings and carries S / (r x 4)
    # per step, 2(r - 1) steps
    r, size = 32, 32 * MIB
    rec = cc.all_reduce(trn1, range(r), size // 4, "fp32")
    links = {c: b for c, b in rec.channel_bytes().items() if c.kind == NEURONLINK}
    assert len(links) == 64
    assert set(np.round(list(links.values()))) == {round(2 * (r - 1) * size / (r * 4))}
    usage = rec.link_usage
    assert usage.steps == 2 * (r - 1)
    assert np.allclose(usage.step_start_ns[1:], usage.step_end_ns[:-1])
    assert usage.step_start_ns[0] == rec.start_ns and usage.step_end_ns[-1] == rec.end_ns
    np.testing.assert_allclose(usage.bytes_in_window(rec.start_ns, rec.end_ns), usage.total_bytes())
    middle = usage.step_end_ns[r - 2]  # end of the ReduceScatter half
    np.testing.assert_allclose(usage.bytes_in_window(rec.start_ns, middle), usage.total_bytes() / 2)
    assert not usage.bytes_in_window(rec.end_ns, rec.end_ns + 1e6).any()


# -- mesh, permute, all-to-all by hand -------------------------------------------------------------


def test_mesh_all_gather_oversubscribes_the_link(inf2):
    # ranks 0, 1 on device 0 and 2, 3 on device 1: the 4 cross-device flows of each direction share
    # one link direction; the on-chip ones are faster
    s_in = 64 * 1024
    rec = cc.all_gather(inf2, [0, 1, 2, 3], s_in // 4, "fp32", algorithm="mesh")
    assert rec.algorithm == "Mesh" and rec.steps == 1
    assert rec.duration_ns == pytest.approx(L_NS + ns(4 * s_in / INF2_LINK))
    assert rec.link_usage.step_flows.max() == 4


def test_mesh_all_reduce_is_two_steps(trn1):
    rec = cc.all_reduce(trn1, [0, 2], 1024, "fp32", algorithm="mesh")  # devices 0 and 1, one hop
    s = 4096
    assert rec.steps == 2
    assert rec.duration_ns == pytest.approx(2 * (L_NS + ns(s / 2 / TRN1_LINK)))


def test_all_to_all_between_two_devices(inf2):
    rec = cc.all_to_all(inf2, [0, 2], 2 * MIB, "bf16")  # each sends half of its 4 MiB to the other
    assert rec.algorithm == "Mesh"
    assert rec.duration_ns == pytest.approx(L_NS + ns(2 * MIB / INF2_LINK))


# -- contention ----------------------------------------------------------------------------------


def test_two_flows_on_one_link_take_twice_as_long(inf2):
    size = 4 * MIB
    one = cc.permute(inf2, [(0, 2)], size // 4, "fp32")  # device 0 -> device 1
    two = cc.permute(inf2, [(0, 2), (1, 3)], size // 4, "fp32")  # both cores of device 0 -> device 1
    assert one.duration_ns == pytest.approx(L_NS + ns(size / INF2_LINK))
    assert two.duration_ns - L_NS == pytest.approx(2 * (one.duration_ns - L_NS))
    # opposite directions of a link do not contend (full duplex)
    swap = cc.permute(inf2, [(0, 2), (2, 0)], size // 4, "fp32")
    assert swap.duration_ns == pytest.approx(one.duration_ns)


def test_ledger_shares_links_between_collectives(inf2):
    size = 4 * MIB
    ledger = cc.LinkLedger()
    first = cc.permute(inf2, [(0, 2)], size // 4, "fp32", ledger=ledger)
    second = cc.permute(inf2, [(1, 3)], size // 4, "fp32", ledger=ledger)  # same link, same time
    assert len(ledger) == 2
    assert first.duration_ns == pytest.approx(L_NS + ns(size / INF2_LINK))
    assert second.duration_ns == pytest.approx(L_NS + ns(2 * size / INF2_LINK))
    later = cc.permute(inf2, [(1, 3)], size // 4, "fp32", ledger=ledger, ready_ns=second.end_ns)
    assert later.duration_ns == pytest.approx(first.duration_ns)  # the link is free again
    elsewhere = cc.permute(inf2, [(10, 12)], size // 4, "fp32", ledger=ledger)  # another link
    assert elsewhere.duration_ns == pytest.approx(first.duration_ns)
    ledger.forget_before(later.end_ns + 1)
    assert len(ledger) == 0
    assert cc.permute(inf2, [(1, 3)], size // 4, "fp32", ledger=ledger).duration_ns == pytest.approx(
        first.duration_ns)


# -- cheap and degenerate cases ------------------------------------------------------------------


def test_single_rank_costs_nothing(trn1):
    rec = cc.all_reduce(trn1, [5], 1000, "bf16", ready_ns=123.0)
    assert rec.algorithm == "Local" and rec.steps == 0
    assert rec.start_ns == rec.end_ns == 123.0 and rec.duration_ns == 0
    assert rec.algbw_bytes_per_s == rec.busbw_bytes_per_s == 0
    assert rec.link_usage.steps == 0 and rec.channel_bytes() == {}
    assert cc.all_gather(trn1, [[0], [1], [2]], 10).duration_ns == 0
    assert cc.permute(trn1, [(3, 3)], 10).algorithm == "Local"


def test_intra_device_pairs_do_not_use_neuronlink(trn1):
    size = 8 * MIB
    local = cc.all_reduce(trn1, [0, 1], size // 4, "fp32")  # the two cores of device 0
    assert {c.kind for c in local.channel_bytes()} == {ON_CHIP}
    # 2 steps, each core sends S / 2 over its own DMA path
    assert local.duration_ns == pytest.approx(2 * (L_ON_CHIP_NS + ns(size / 2 / ON_CHIP_BPS)))
    remote = cc.all_reduce(trn1, [0, 2], size // 4, "fp32")  # cores of devices 0 and 1
    assert {c.kind for c in remote.channel_bytes()} == {NEURONLINK}
    assert remote.duration_ns > local.duration_ns


def test_concurrent_groups_on_disjoint_rows(trn1):
    # tensor-parallel groups of 8 ranks = one torus row each: rows share no link
    rows = [list(range(8 * i, 8 * i + 8)) for i in range(4)]
    together = cc.all_reduce(trn1, rows, 4 * MIB, "bf16")
    alone = cc.all_reduce(trn1, rows[0], 4 * MIB, "bf16")
    assert together.duration_ns == pytest.approx(alone.duration_ns)
    assert together.replica_group_text.startswith("[[0, 1, 2, 3, 4, 5, 6, 7], [8, 9")
    assert sum(together.channel_bytes().values()) == pytest.approx(4 * sum(alone.channel_bytes().values()))


def test_trn2_lnc_ranks(trn1):
    lnc2 = instance_topology("trn2.48xlarge")
    rec = cc.all_reduce(lnc2, range(64), MIB, "bf16")
    assert rec.rings == 4 and rec.steps == 2 * 63
    with pytest.raises(ValueError, match=r"core 64 does not exist on trn2\.48xlarge at LNC=2"):
        cc.all_reduce(lnc2, range(65), MIB)
    assert cc.all_reduce(instance_topology("trn2.48xlarge", lnc=1), range(128), MIB).steps == 2 * 127


def test_multi_instance_pays_efa_latency():
    topo = instance_topology("trn1.32xlarge", nodes=2)
    rec = cc.all_reduce(topo, range(64), 16 * MIB, "bf16", algorithm="ring")  # flat, not hierarchical
    assert rec.steps == 2 * 63
    assert rec.duration_ns > rec.steps * 15_000  # every ring step crosses EFA (§6: ~15 us per hop)
    assert any(c.kind == EFA for c in rec.channel_bytes())


# -- bandwidth figures, algorithm choice, ready times ----------------------------------------------


@pytest.mark.parametrize(
    ("operation", "ranks", "factor"),
    [("AllReduce", 8, 2 * 7 / 8), ("AllReduce", 32, 2 * 31 / 32), ("AllGather", 8, 7 / 8),
     ("ReduceScatter", 24, 23 / 24), ("AllToAll", 4, 3 / 4), ("Permute", 2, 1.0)],
)
def test_bus_factors(operation, ranks, factor):
    assert cc.bus_factor(operation, ranks) == pytest.approx(factor)


def test_algbw_and_busbw_of_a_record(trn1):
    rec = cc.all_gather(trn1, range(8), 1000, "fp32")
    assert (rec.input_bytes, rec.output_bytes, rec.num_elements) == (4000, 32000, 8000)
    assert rec.algbw_bytes_per_s == pytest.approx(32000 / (rec.duration_ns * 1e-9))
    assert rec.busbw_bytes_per_s == pytest.approx(7 / 8 * rec.algbw_bytes_per_s)
    row = rec.ccop_row()
    assert row["operation"] == "AllGather" and row["algorithm"] == rec.algorithm
    assert row["dtype"] == "fp32" and row["replica_group"] == "[[0, 1, 2, 3, 4, 5, 6, 7]]"
    assert row["duration_ns"] == row["end_ts"] - row["start_ts"]
    assert row["input_size"] == 4000 and row["output_size"] == 32000


def test_algorithm_switches_at_1_mb(trn1):
    assert cc.choose_algorithm("AllReduce", 999_999, 8) == "Mesh"
    assert cc.choose_algorithm("AllReduce", 1_000_000, 8) == "Ring"
    assert cc.all_reduce(trn1, range(8), 249_999, "fp32").algorithm == "Mesh"  # 999,996 B
    assert cc.all_reduce(trn1, range(8), 250_000, "fp32").algorithm == "Ring"  # 1,000,000 B
    # all-gather is sized by its output: 125 kB in per rank, 1 MB out
    assert cc.all_gather(trn1, range(8), 31_250, "fp32").algorithm == "Ring"
    lower = cc.CollectiveParams(mesh_max_bytes=1000)
    assert cc.all_reduce(trn1, range(8), 1000, "fp32", params=lower).algorithm == "Ring"
    assert cc.all_reduce(trn1, range(8), 10**6, "fp32", algorithm="mesh").algorithm == "Mesh"
    assert cc.all_to_all(trn1, range(8), 8 * MIB).algorithm == "Mesh"


def test_hop_latency_is_a_parameter(trn1):
    base = cc.all_reduce(trn1, range(8), 10**6, "fp32")
    slower = cc.all_reduce(trn1, range(8), 10**6, "fp32",
                           params=replace(cc.DEFAULT_PARAMS, hop_latency_ns=2_000.0))
    assert slower.duration_ns - base.duration_ns == pytest.approx(base.steps * 500.0)


def test_start_waits_for_the_last_rank(trn1):
    ready = [100.0 * i for i in range(8)]
    rec = cc.all_reduce(trn1, range(8), 10**6, "fp32", ready_ns=ready)
    alone = cc.all_reduce(trn1, range(8), 10**6, "fp32")
    assert rec.start_ns == 700.0
    assert rec.end_ns == pytest.approx(700.0 + alone.duration_ns)
    assert rec.ccop_row(0)["cc_trigger_start_delay"] == 700
    assert rec.ccop_row(7)["cc_trigger_start_delay"] == 0
    by_rank = cc.all_reduce(trn1, range(8), 10**6, "fp32", ready_ns={r: 100.0 * r for r in range(8)})
    assert by_rank.start_ns == 700.0


def test_a_32_rank_ring_is_cheap_to_time(trn1, monkeypatch):
    """Timing a ring again builds no plan (plans are cached) and times each phase once, not each of its
    2 x 31 steps, so a call's cost does not grow with the ring. (Its wall time is bench/collectives.py's.)"""
    from neuroncore.collectives import operations

    first = cc.all_reduce(trn1, range(32), 64 * MIB, "bf16")  # plan built and cached
    before = operations._plan.cache_info()
    timed: list[int] = []
    step_ns = operations.step_ns

    def counted(*args, **kwargs):
        timed.append(1)
        return step_ns(*args, **kwargs)

    monkeypatch.setattr(operations, "step_ns", counted)
    for _ in range(100):
        again = cc.all_reduce(trn1, range(32), 64 * MIB, "bf16")
    after = operations._plan.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 100
    assert 0 < len(timed) / 100 < 2 * 31  # step times per call: per phase, fewer than the ring's steps
    assert again.duration_ns == first.duration_ns


@settings(max_examples=40, deadline=None)
@given(
    ranks=st.lists(st.integers(0, 31), min_size=2, max_size=32, unique=True),
    size_mib=st.integers(1, 512),
)
def test_ring_busbw_never_beats_the_link_bound(ranks, size_mib):
    trn1 = instance_topology("trn1.32xlarge")
    rec = cc.all_reduce(trn1, ranks, size_mib * MIB // 2, "bf16", algorithm="ring")
    spans_devices = len({r // 2 for r in ranks}) > 1
    if spans_devices:
        assert rec.busbw_bytes_per_s <= trn1.neuronlink_egress_bytes_per_s(0) * (1 + 1e-9)
    assert rec.duration_ns >= rec.steps * L_ON_CHIP_NS
    bigger = cc.all_reduce(trn1, ranks, 2 * size_mib * MIB // 2, "bf16", algorithm="ring")
    assert bigger.duration_ns > rec.duration_ns


# -- bad input -----------------------------------------------------------------------------------


def test_unknown_instance_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown instance type 'trn9\.big'; known: inf2\.24xlarge"):
        cc.all_reduce("trn9.big", [0, 1], 10)


def test_core_that_does_not_exist(trn1):
    with pytest.raises(ValueError, match=r"core 32 does not exist on trn1\.32xlarge: its logical cores "
                                         r"are 0\.\.31"):
        cc.all_reduce(trn1, range(33), 10)
    with pytest.raises(ValueError, match=r"core -1 does not exist"):
        cc.all_gather(trn1, [[0, 1], [2, -1]], 10)


def test_lnc_errors():
    with pytest.raises(ValueError, match=r"LNC on trn2\.48xlarge must be 1 or 2, not 3"):
        instance_topology("trn2.48xlarge", lnc=3)
    with pytest.raises(ValueError, match=r"inf2\.48xlarge has no Logical NeuronCore \(LNC\) setting"):
        instance_topology("inf2.48xlarge", lnc=2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: cc.all_reduce(t, [[0, 1], [2]], 10), r"same size, got sizes \[1, 2\]"),
        (lambda t: cc.all_reduce(t, [[0, 1], [1, 2]], 10), r"core 1 appears more than once"),
        (lambda t: cc.all_reduce(t, [], 10), r"replica groups are empty"),
        (lambda t: cc.all_reduce(t, [0, [1, 2]], 10), r"replica groups must be core ids, or lists"),
        (lambda t: cc.all_reduce(t, [0, 1], 10, algorithm="tree"),
         r"AllReduce supports algorithm auto or Ring, Mesh, not 'tree'"),
        (lambda t: cc.all_to_all(t, [0, 1], 10, algorithm="ring"),
         r"AllToAll supports algorithm auto or Mesh"),
        (lambda t: cc.reduce_scatter(t, range(8), 10), r"count divisible by 8, not 10"),
        (lambda t: cc.all_reduce(t, [0, 1], -1), r"count must be a non-negative integer"),
        (lambda t: cc.all_reduce(t, [0, 1], 10, "fp64"), r"unsupported dtype 'fp64'"),
        (lambda t: cc.all_reduce(t, [0, 1], 10, ready_ns=[0.0]), r"1 times for 2 ranks"),
        (lambda t: cc.permute(t, [0, 1], 10), r"Permute takes \(source, target\) pairs"),
        (lambda t: cc.permute(t, [(0, 1), (0, 2)], 10), r"core 0 is the source of more than one"),
        (lambda t: cc.collective("Broadcast", t, [0, 1], 10), r"unknown collective 'Broadcast'"),
        (lambda t: cc.all_reduce(t, [0, 1], 10, params=cc.CollectiveParams(max_rings=0)),
         r"max_rings must be at least 1"),
    ],
)
def test_bad_input(trn1, call, message):
    with pytest.raises(ValueError, match=message):
        call(trn1)
