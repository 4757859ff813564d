"""Hierarchical multi-node collectives: intra-node stage, inter-node stage over EFA on 1/L of the
data, intra-node stage (neuroncore.md §6; neuroncore/collectives/hierarchical.py)."""

from __future__ import annotations

import pytest

from neuroncore import collectives as cc
from neuroncore.collectives.params import DEFAULT_PARAMS
from neuroncore.topology import EFA, ON_CHIP, instance_topology

MIB = 2**20


@pytest.fixture(scope="module")
def two_nodes():
    return instance_topology("trn1.32xlarge", nodes=2)


def _hop(topo, a, b):
    """(latency of a step between ranks a and b, the slowest channel's bytes/s on its path)."""
    latency = {ON_CHIP: DEFAULT_PARAMS.on_chip_hop_latency_ns, EFA: DEFAULT_PARAMS.efa_hop_latency_ns}
    path = topo.path(a, b)
    return sum(latency[c.kind] for c in path), min(c.bytes_per_s for c in path)


def test_all_reduce_time_is_the_formula(two_nodes):
    """Ranks 0, 1 (one chip of node 0) and 32, 33 (one chip of node 1): local ReduceScatter over the
    chip (1 step of S/2), cross AllReduce over EFA (2 steps of S/4, the chip's two ranks sharing its
    EFA transmit channel), local AllGather (1 step of S/2): bytes/bandwidth + latency per step."""
    count = 8 * MIB
    size = count * 2  # bf16
    rec = cc.all_reduce(two_nodes, [[0, 1, 32, 33]], count, "bf16")
    chip_lat, chip_bw = _hop(two_nodes, 0, 1)
    efa_lat, efa_bw = _hop(two_nodes, 0, 32)
    local = chip_lat + (size / 2) / chip_bw * 1e9
    cross = 2 * (efa_lat + (size / 4) / (efa_bw / 2) * 1e9)
    assert rec.algorithm == cc.HIERARCHICAL
    assert rec.steps == 1 + 2 + 1
    assert rec.duration_ns == pytest.approx(local + cross + local, rel=1e-9)
    assert rec.ccop_row(0)["algorithm"] == "Hierarchical"


def test_cross_stage_moves_one_local_share_over_efa(two_nodes):
    """The DP layout of a tp2 job over 2 nodes: 16 ranks per node per group. Hierarchical sends
    each rank's 1/16 shard over EFA and pays the EFA latency 2 instead of 62 times (the flat ring's
    every step waits for its EFA hop)."""
    groups = [[t + 2 * d for d in range(32)] for t in range(2)]
    count = 16 * MIB
    hier = cc.all_reduce(two_nodes, groups, count, "bf16")
    flat = cc.all_reduce(two_nodes, groups, count, "bf16", algorithm="ring")

    def efa_bytes(rec):
        return sum(b for c, b in rec.channel_bytes().items() if c.kind == EFA)

    assert (hier.algorithm, flat.algorithm) == ("Hierarchical", "Ring")
    assert hier.duration_ns < flat.duration_ns / 4
    # per rank: 2 (N-1)/N x S/L out and as much in, over 64 ranks
    assert efa_bytes(hier) == pytest.approx(64 * 2 * (2 * 1 / 2 * count * 2 / 16), rel=1e-9)
    assert efa_bytes(hier) < efa_bytes(flat)


@pytest.mark.parametrize(("operation", "count", "steps"),
                         [("ReduceScatter", 64 * 1024, 1 + 1), ("AllGather", 4096, 1 + 1)])
def test_reduce_scatter_and_all_gather_stages(two_nodes, operation, count, steps):
    rec = cc.collective(operation, two_nodes, [[0, 1, 32, 33]], count, "bf16", algorithm="hierarchical")
    assert rec.algorithm == "Hierarchical" and rec.steps == steps
    assert rec.output_bytes == (count * 2 // 4 if operation == "ReduceScatter" else count * 2 * 4)


def test_hierarchical_needs_several_nodes_with_several_ranks_each(two_nodes):
    assert cc.all_reduce(two_nodes, [[0, 32]], MIB).algorithm == "Ring"  # one rank per node: flat
    assert cc.all_reduce(instance_topology("trn1.32xlarge"), range(32), MIB).algorithm == "Ring"
    with pytest.raises(ValueError, match="hierarchically only over groups spread over several nodes"):
        cc.all_reduce(two_nodes, [[0, 1, 2, 3]], MIB, algorithm="hierarchical")


def test_stages_share_links_through_a_ledger(two_nodes):
    ledger = cc.LinkLedger()
    first = cc.all_reduce(two_nodes, [[0, 1, 32, 33]], 8 * MIB, ledger=ledger)
    second = cc.all_reduce(two_nodes, [[2, 3, 34, 35]], 8 * MIB, ledger=ledger)
    alone = cc.all_reduce(two_nodes, [[2, 3, 34, 35]], 8 * MIB)
    assert len(ledger) == 6 and first.duration_ns == pytest.approx(alone.duration_ns)
    assert second.duration_ns >= alone.duration_ns
