"""Small hand-built profiles whose figures are worked out by hand (tests of ``formats.figures``,
``formats.attribution`` and the consistency test).

``tiny`` (T = 1000 ns, one execution [0, 1000)):

    Tensor row        [0,100) LDWEIGHTS op1 ft=500        [300,400) LDWEIGHTS op2 raw=0
    TensorMatrix row  [50,150) MATMUL op1 raw=1000        [350,360) MATMUL op2 raw=1000
    Vector row        [0,50) op1                          [500,600) op3
    DmaPacket         [0,200) 1000 B HBM read op1         [100,300) 2000 B HBM write op2
    CcOp              [600,700)

    Tensor busy = |[0,150) ∪ [300,400)| = 250; rows: Tensor 200, TensorMatrix 110; Vector 150
    DMA active 300, 3000 B; HBM read 1000, write 2000; CC 100; ∪ everything = |[0,400) ∪ [500,700)| = 600
    FLOPs: hardware 2500, transpose 500, model 2000 (op2's LDWEIGHTS: raw 0 counts 0)
    ops (layer, line): op1 dot.1 (model/mlp, m.py:10), op2 dot.2 (model/attn, m.py:20), op3 tanh.3 (model,
    m.py:10); op time = ∪ of its instructions and packets: op1 200, op2 300 ([100,400)), op3 100
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from formats.schema import SCHEMA
from formats.writer import ProfileWriter

HW = {  # Metadata's required hardware constants
    "dma_ddr_bandwidth": 272e9, "num_dma_engines_per_neuroncore": 16, "hbm_ddr_bandwidth": 410e9,
    "tensor_engine_num_rows": 128, "tensor_engine_num_cols": 128, "tensor_engine_clock_freq": 2.8,
    "vector_engine_clock_freq": 1.12, "vector_engine_num_channels": 128, "scalar_engine_clock_freq": 1.4,
    "scalar_engine_num_channels": 128, "gpsimd_engine_clock_freq": 1.4, "gpsimd_engine_num_channels": 128,
    "neuroncore_clock_freq": 1.4, "is_simulation": True,
}
PEAK = 2.0 * 128 * 128 * 2.8e9


def filled(table: str, columns: dict[str, Any]) -> dict[str, Any]:
    """``columns`` plus a plain value for every other required column of ``table``."""
    n = len(next(iter(columns.values())))
    out = dict(columns)
    for f in SCHEMA.tables[table].fields:
        if f.required and f.name not in out:
            if f.type == "string":
                out[f.name] = pa.array(["x"] * n)
            elif f.type.startswith("array"):
                out[f.name] = pa.array([[]] * n, pa.list_(pa.int64() if "int" in f.type else pa.string()))
            elif f.type == "bool":
                out[f.name] = np.zeros(n, bool)
            else:
                out[f.name] = np.zeros(n, np.float64 if f.type.startswith("float") else np.int64)
    if "duration_ns" in out and "start_ts" in out and "duration_ns" not in columns:
        out["duration_ns"] = np.asarray(out["end_ts"]) - np.asarray(out["start_ts"])
    return out


def tiny_tables() -> dict[str, dict[str, Any]]:
    """The ``tiny`` profile's event tables (module docstring)."""
    return {
        "Instruction": filled("Instruction", {
            "start_ts": np.array([0, 50, 0, 300, 350, 500]),
            "end_ts": np.array([100, 150, 50, 400, 360, 600]),
            "engine": ["Tensor", "Tensor", "Vector", "Tensor", "Tensor", "Vector"],
            "timeline_track": ["Tensor", "TensorMatrix", "Vector", "Tensor", "TensorMatrix", "Vector"],
            "opcode": ["LDWEIGHTS", "MATMUL", "TENSOR_TENSOR", "LDWEIGHTS", "MATMUL", "ACTIVATE"],
            "id": np.arange(1, 7), "raw_hlo_id": pa.array([1, 1, 1, 2, 2, 3], pa.int64()),
            "hlo_name": ["dot.1", "dot.1", "dot.1", "dot.2", "dot.2", "tanh.3"],
            "layer": ["model/mlp", "model/mlp", "model/mlp", "model/attn", "model/attn", "model"],
            "raw_flops": pa.array([0, 1000, None, 0, 1000, None], pa.int64()),
            "flops_transpose": pa.array([500, None, None, None, None, None], pa.int64()),
            "hbm_read_bytes": np.zeros(6, np.int64), "hbm_write_bytes": np.zeros(6, np.int64),
            "bir_debug_info_source_location": ["m.py:10"] * 3 + ["m.py:20"] * 2 + ["m.py:10"],
        }),
        "DmaPacket": filled("DmaPacket", {
            "start_ts": np.array([0, 100]), "end_ts": np.array([200, 300]), "id": np.array([1, 2]),
            "packet_aggregation_id": np.array([1, 2]), "transfer_bytes": np.array([1000, 2000]),
            "read_bytes": np.array([1000, 2000]), "write_bytes": np.array([1000, 2000]),
            "queue_type": ["data", "data"], "queue_name": ["qSyncIO0", "qSyncIO0"],
            "raw_hlo_id": pa.array([1, 2], pa.int64()),
            "hbm_read_bytes": np.array([1000, 0]), "hbm_write_bytes": np.array([0, 2000]),
        }),
        "CcOp": filled("CcOp", {"start_ts": np.array([600]), "end_ts": np.array([700]),
                                "operation": ["AllReduce"], "stream_id": np.array([0])}),
        "ExecutionInfo": {"execution_index": pa.array([0], pa.int32()), "neff_name": ["tiny"],
                          "execution_start_ts": [0], "execution_end_ts": [1000]},
    }


def write_profile(path: Path, tables: dict[str, dict[str, Any]], *, summary: bool = True,
                  metadata: dict[str, Any] | None = None) -> Path:
    """A profile of ``tables``; ``summary`` adds Summary/OpcodeSummary/ActiveTime/DmaUsage computed by
    ``formats.summary`` (as a capture's close does)."""
    meta = {**HW, **(metadata or {})}
    derived: list[tuple[str, pa.Table]] = []
    if summary:
        from formats import summary as summary_module
        from formats.reader import open_profile

        plain = write_profile(path.with_name(path.name + ".plain"), tables, summary=False, metadata=metadata)
        derived = list(summary_module.compute(open_profile(plain)).tables())
    with ProfileWriter(path, meta) as writer:
        for name, columns in tables.items():
            writer.write(name, columns)
        for name, table in derived:
            writer.write(name, table)
    return path


def write_tiny(path: Path, *, summary: bool = True) -> Path:
    return write_profile(path, tiny_tables(), summary=summary)
