"""Collective-communication benchmark of the timing model: prints one JSON line.

    python bench/collectives.py

For inf2.48xlarge (24 ranks = every core) and trn1.32xlarge (32 ranks), an nccom-test-style sweep of
AllReduce and AllGather over message sizes 8 KiB .. 256 MiB (fp32; the size is the larger of the
input and output buffers, as nccom-test's ``size(B)``): model time, algorithm, algbw and busbw next
to the link bound, i.e. the most busbw can be given the per-chip NeuronLink bandwidth (the sum of a
chip's outgoing link directions: a ring moves each rank's share through its chip's links).

Bandwidths are GB/s = 10^9 B/s. (nccom-test prints GiB/s under a "GB/s" heading: its guide's
example, 33554432 B in 768 us, is 43.7 GB/s but shows 40.69.) ``python_wall_s`` is the wall time of
the whole sweep, plans included.
"""

from __future__ import annotations

import json
import time

from neuroncore import collectives as cc
from neuroncore.collectives.params import DEFAULT_PARAMS
from neuroncore.topology import instance_topology

SIZES_BYTES = [8 * 2**10, 64 * 2**10, 512 * 2**10, 4 * 2**20, 32 * 2**20, 256 * 2**20]
DTYPE, ITEMSIZE = "fp32", 4
INSTANCES = {"inf2.48xlarge": 24, "trn1.32xlarge": 32}


def sweep(name: str, ranks: int) -> dict:
    topo = instance_topology(name)
    bound = topo.neuronlink_egress_bytes_per_s(0)
    out: dict = {
        "ranks": ranks,
        "devices": len(topo.devices),
        "link_GBps_per_direction": round(topo.neuronlinks[0].bytes_per_s_per_direction / 1e9, 2),
        "link_bound_busbw_GBps": round(bound / 1e9, 2),
    }
    for label, run, elements in [
        ("all_reduce", cc.all_reduce, lambda size: size // ITEMSIZE),
        ("all_gather", cc.all_gather, lambda size: size // (ranks * ITEMSIZE)),  # input per rank
    ]:
        rows = []
        for size in SIZES_BYTES:
            rec = run(topo, range(ranks), elements(size), DTYPE)
            rows.append({
                "size_bytes": rec.size_bytes,
                "algorithm": rec.algorithm,
                "rings": rec.rings,
                "steps": rec.steps,
                "time_us": round(rec.duration_ns / 1e3, 2),
                "algbw_GBps": round(rec.algbw_bytes_per_s / 1e9, 2),
                "busbw_GBps": round(rec.busbw_bytes_per_s / 1e9, 2),
                "busbw_of_bound": round(rec.busbw_bytes_per_s / bound, 3),
            })
        out[label] = rows
    return out


def main() -> None:
    t = time.perf_counter()
    results = {name: sweep(name, ranks) for name, ranks in INSTANCES.items()}
    wall = time.perf_counter() - t
    print(json.dumps({
        "bench": "collectives",
        "dtype": DTYPE,
        "assumptions": {
            "hop_latency_us": DEFAULT_PARAMS.hop_latency_ns / 1e3,
            "mesh_below_bytes": DEFAULT_PARAMS.mesh_max_bytes,
            "link_bandwidth": "per direction (full duplex); per-chip figure / links per chip",
        },
        **results,
        "python_wall_s": round(wall, 4),
    }))


if __name__ == "__main__":
    main()
