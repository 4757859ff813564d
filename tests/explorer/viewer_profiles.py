"""Profiles for the viewer tests: our bundled samples, and a hand-made one in the real Neuron Explorer
layout (as AWS's tool writes it, with what it leaves out)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
BERT = REPO / "sample_profiles" / "bert-layer" / "device"
LLAMA_TP2 = REPO / "sample_profiles" / "llama-decode-tp2" / "device"
SOURCE_ROOT = Path(__file__).resolve().parent / "data" / "viewer_src"

# (layer, hlo_name, raw_hlo_id, leaf stack frame, engines and opcodes of its instructions)
OPS = [
    (
        "NeuronLlamaDecoderLayer[0]/NeuronAttention[0]",
        "dot.1",
        11,
        3,
        [("Tensor", "MATMUL"), ("PE", "MATMUL"), ("tensor", "LDWEIGHTS"), ("DVE", "TENSOR_COPY")],
    ),
    (
        "NeuronLlamaDecoderLayer[0]/NeuronAttention[0]",
        "softmax.2",
        12,
        4,
        [("ACT", "ACTIVATE"), ("Vector", "TENSOR_REDUCE"), ("DVE", "TENSOR_TENSOR")],
    ),
    (
        "NeuronLlamaDecoderLayer[0]/NeuronAttention[0]",
        "dot.3",
        13,
        5,
        [("Tensor", "MATMUL"), ("Pool", "IOTA")],
    ),
    (
        "NeuronLlamaDecoderLayer[0]/NeuronMLP[0]",
        "dot.4",
        14,
        6,
        [("Tensor", "MATMUL"), ("tensor", "MATMUL"), ("Scalar", "ACTIVATE"), ("SP", "WRITE")],
    ),
    ("NeuronLlamaDecoderLayer[0]", "add.5", 15, 7, [("Vector", "TENSOR_TENSOR")]),
]


def _metadata(last: int) -> pa.Table:
    """Metadata as the real tool writes it: no neuronscope columns, float64 clocks."""
    return pa.table(
        {
            "profile_schema_version": ["7.4.0"],
            "ntff_version": pa.array([3], pa.int32()),
            "num_physical_cores": pa.array([1], pa.int32()),
            "vnc_enabled": [False],
            "first_hw_timestamp": [1_000],
            "last_hw_timestamp": [last],
            "first_ts": ["1970-01-01 00:00:00+00:00"],
            "last_ts": ["1970-01-01 00:00:00+00:00"],
            "dma_ddr_bandwidth": [2.72e11],
            "num_dma_engines_per_neuroncore": pa.array([16], pa.int32()),
            "hbm_ddr_bandwidth": [4.1e11],
            "tensor_engine_num_rows": [128],
            "tensor_engine_num_cols": [128],
            "tensor_engine_clock_freq": [2.8],
            "vector_engine_clock_freq": [1.12],
            "vector_engine_num_channels": [128],
            "scalar_engine_clock_freq": [1.4],
            "scalar_engine_num_channels": [128],
            "gpsimd_engine_clock_freq": [1.4],
            "gpsimd_engine_num_channels": [128],
            "neuroncore_clock_freq": [1.4],
            "ticks_per_nanosec": [1],
            "instance_type": ["trn1.2xlarge"],
            "explorer_version": ["2.31.0"],
        }
    )


def _instructions() -> list[dict]:
    rows = []
    t = 1_000
    for layer, hlo, raw, frame, instrs in OPS:
        for repeat in range(30):
            for engine, opcode in instrs:
                duration = 200 if opcode == "MATMUL" else 80
                flops = 2 * 128 * 128 * 128 if opcode == "MATMUL" else 0
                rows.append(
                    {
                        "start_ts": t,
                        "end_ts": t + duration,
                        "duration_ns": duration,
                        "engine": engine,
                        "opcode": opcode,
                        "operands": "S[5] (Tensor)++@complete",
                        "id": len(rows),
                        "pc": len(rows),
                        "bir_id": f"sg0000:{len(rows)}",
                        "hlo_name": hlo,
                        "raw_hlo_id": raw,
                        "raw_framework_id": 100 + raw,
                        "layer": layer,
                        "stack_frame_ids": f"[{frame}]",
                        "raw_flops": flops,
                        "hbm_read_bytes": 4096 if engine.lower() in ("tensor", "pe") else 0,
                        "evt_wait_time_ns": 150 if opcode == "MATMUL" and repeat % 2 == 0 else 0,
                    }
                )
                t += duration // 2 + 7 * (repeat % 4)
        t += 500
    return rows


def real_layout_profile(parent: Path) -> Path:
    """``parent/profiles/global/llama@latest``: Instruction split in two parts with mixed engine
    spellings and a column we do not know, DmaPacket, the StackFrame tables (ids as text, leaf-only
    stacks), and nothing else: no Summary, FrameworkNode, HloInstruction, ExecutionInfo."""
    root = parent / "profiles" / "global" / "llama@latest"
    root.mkdir(parents=True)
    rows = _instructions()
    pq.write_table(_metadata(max(r["end_ts"] for r in rows) + 100), root / "Metadata.parquet")
    half = len(rows) // 2
    first = pa.Table.from_pylist(rows[:half])
    second = pa.Table.from_pylist(rows[half:]).append_column(
        "kaena_internal_flags", pa.array([7] * (len(rows) - half))
    )
    pq.write_table(first, root / "Instruction_0.parquet")
    pq.write_table(second, root / "Instruction_1.parquet")
    n = 24
    pq.write_table(
        pa.table(
            {
                "start_ts": [1_000 + 400 * i for i in range(n)],
                "end_ts": [1_300 + 400 * i for i in range(n)],
                "duration_ns": [300] * n,
                "id": list(range(n)),
                "packet_idx": pa.array([0] * n, pa.int32()),
                "packet_aggregation_id": list(range(n)),
                "read_bytes": [2048] * n,
                "write_bytes": [2048] * n,
                "transfer_bytes": [2048] * n,
                "throughput": [6.8e9] * n,
                "queue_type": ["data"] * n,
                "crc": [0] * n,
                "queue_name": ["qSyncIO0"] * n,
            }
        ),
        root / "DmaPacket.parquet",
    )
    names = ["/home/ubuntu/llama/run.py", "/home/ubuntu/llama/model.py"]
    pq.write_table(pa.table({"id": ["1", "2"], "name": names}), root / "StackFrameFileName.parquet")
    pq.write_table(
        pa.table({"id": ["1", "2", "3", "4", "5"], "name": ["main", "forward", "attn", "mlp", "x"]}),
        root / "StackFrameFunctionName.parquet",
    )
    # locations: run.py:12 (main), model.py:23 (layer forward), model.py:9/13/19/23 (ops)
    locations = [
        ("1", 1, 1, 12),
        ("2", 2, 2, 23),
        ("3", 2, 3, 12),
        ("4", 2, 3, 13),
        ("5", 2, 3, 14),
        ("6", 2, 4, 19),
        ("7", 2, 2, 24),
    ]
    pq.write_table(
        pa.table(
            {
                "id": [r[0] for r in locations],
                "file_name_id": pa.array([r[1] for r in locations], pa.int32()),
                "function_name_id": pa.array([r[2] for r in locations], pa.int32()),
                "line_number": pa.array([r[3] for r in locations], pa.int32()),
            }
        ),
        root / "StackFrameFileLocation.parquet",
    )
    frames = [
        ("1", 1, "0"),
        ("2", 2, "1"),
        ("3", 3, "2"),
        ("4", 4, "2"),
        ("5", 5, "2"),
        ("6", 6, "2"),
        ("7", 7, "1"),
    ]
    pq.write_table(
        pa.table(
            {
                "id": [f[0] for f in frames],
                "file_location_id": pa.array([f[1] for f in frames], pa.int32()),
                "parent_frame_id": [f[2] for f in frames],
            }
        ),
        root / "StackFrame.parquet",
    )
    return root


def bert_copy(
    parent: Path,
    *,
    file_names: dict[str, str] | None = None,
    metadata: dict[str, object] | None = None,
    name: str = "bert",
) -> Path:
    """A copy of the bert-layer sample profile with its ``StackFrameFileName`` names replaced
    (``file_names``: old name -> new name) and ``metadata`` columns set (added when absent)."""
    import shutil

    source = next(p.parent for p in BERT.rglob("Metadata.parquet"))
    root = parent / name
    shutil.copytree(source, root)
    if file_names:
        table = pq.read_table(root / "StackFrameFileName.parquet")
        names = [file_names.get(n, n) for n in table.column("name").to_pylist()]
        table = table.set_column(table.schema.get_field_index("name"), "name", pa.array(names, pa.string()))
        pq.write_table(table, root / "StackFrameFileName.parquet")
    if metadata:
        table = pq.read_table(root / "Metadata.parquet")
        for key, value in metadata.items():
            column = pa.array([value])
            if key in table.column_names:
                table = table.set_column(table.schema.get_field_index(key), key, column)
            else:
                table = table.append_column(key, column)
        pq.write_table(table, root / "Metadata.parquet")
    return root
