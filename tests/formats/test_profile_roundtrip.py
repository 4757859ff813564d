"""Core -> ProfileRecorder -> ProfileWriter -> reader, on a built-in workload (bert-layer)."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from formats.reader import open_profile
from formats.schema import ENGINE_NAMES, PROFILE_SCHEMA_VERSION, SCHEMA
from formats.validate import validate
from neuroncore.hardware import NC_V2
from tests.fixtures.recorded import EXECUTIONS, Recorded


def test_row_counts_equal_what_the_core_emitted(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    assert profile.complete and profile.is_simulation
    assert profile.num_rows("Instruction") == recorded.program.n_instructions * EXECUTIONS
    assert profile.num_rows("Instruction") == recorded.rows("instruction")
    assert profile.num_rows("DmaPacket") == recorded.rows("dma_packet")
    assert profile.num_rows("SemaphoreUpdate") == recorded.rows("semaphore_update")
    assert profile.num_rows("HbmUsage") == recorded.rows("hbm_usage")
    assert profile.num_rows("ExecutionInfo") == EXECUTIONS
    # one Flow edge per DMA transfer that an instruction triggered, one per semaphore wait
    program = recorded.program
    triggered = program.trigger[program.trigger >= 0].size
    waits = sum(int(program.resource[d] != 7) for i in np.flatnonzero(program.resource < 6)
                for d in program.deps(int(i)))
    assert profile.num_rows("Flow") == (triggered + waits) * EXECUTIONS


def test_files_carry_the_schema_types(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    for name, table in profile.tables.items():
        definition = SCHEMA.tables[name]
        for file in table.files:
            stored = pq.read_schema(file)
            assert stored.names == definition.names, name
            for f in definition.fields:
                assert stored.field(f.name).type == f.arrow_type, (name, f.name)
                assert stored.field(f.name).nullable == (not f.required), (name, f.name)
    assert validate(recorded.path).conformant


def test_instruction_values_match_the_core(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    instr = profile.table("Instruction")
    starts = [int(x) for x in recorded.column("instruction", "start_ts")]
    assert instr.column("start_ts").to_pylist() == starts
    assert instr.column("evt_wait_time_ns").to_pylist() == [
        int(x) for x in recorded.column("instruction", "evt_wait_time_ns")]
    assert sum(instr.column("raw_flops").to_pylist()) == sum(recorded.column("instruction", "raw_flops"))
    ids = instr.column("id").to_numpy()
    assert np.unique(ids).size == ids.size  # unique across executions
    assert set(instr.column("engine").to_pylist()) <= set(ENGINE_NAMES)
    assert "TensorMatrix" in set(instr.column("timeline_track").to_pylist())
    durations = pa.compute.subtract(instr.column("end_ts"), instr.column("start_ts"))
    assert durations.equals(instr.column("duration_ns"))
    # program text and attribution come from program_loaded
    assert all(instr.column("operands").to_pylist())
    writes = instr.filter(pa.compute.equal(instr.column("opcode"), "WRITE"))
    assert set(writes.column("compiler_opcode").to_pylist()) == {"PSEUDO_DMA_TRIGGER"}
    hlo = {op.name for op in recorded.program.graph.ops}
    assert set(instr.column("hlo_name").drop_null().to_pylist()) <= hlo
    assert instr.column("bir_id")[0].as_py().startswith("sg0000:")


def test_dma_packets_and_flow_edges_join(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    packets = profile.table("DmaPacket")
    assert sum(packets.column("transfer_bytes").to_pylist()) == sum(
        recorded.column("dma_packet", "transfer_bytes"))
    assert set(packets.column("queue_type").to_pylist()) <= set(SCHEMA.enums["DmaQueueType"])
    hbm = pa.compute.add(packets.column("hbm_read_bytes"), packets.column("hbm_write_bytes"))
    assert 0 < pa.compute.sum(hbm).as_py() <= 2 * pa.compute.sum(packets.column("transfer_bytes")).as_py()
    ops = {op.name: i for i, op in enumerate(recorded.program.graph.ops)}
    packed = set(packets.column("raw_hlo_id").drop_null().to_pylist())
    assert {x & 0xFFFFFFFF for x in packed} <= set(ops.values())  # op index in the low 32 bits
    instr_ops = set(profile.table("Instruction", ["raw_hlo_id"]).column("raw_hlo_id").drop_null()
                    .to_pylist())
    assert len({x >> 32 for x in packed | instr_ops}) == 1  # one loaded model in the high bits
    assert np.unique(packets.column("id").to_numpy()).size == packets.num_rows
    # packet_idx restarts at 0 for every transfer
    first = packets.filter(pa.compute.equal(packets.column("packet_idx"), 0))
    assert first.num_rows == np.unique(packets.column("packet_aggregation_id").to_numpy()).size
    flow = profile.table("Flow")
    flow = flow.filter(pa.compute.equal(flow.column("dependency_type"), "DMA_TRIGGER"))
    instruction_ids = set(profile.table("Instruction", ["id"]).column("id").to_pylist())
    blocks = set(packets.column("packet_aggregation_id").to_pylist())
    assert set(flow.column("in_id").to_pylist()) <= instruction_ids
    assert set(flow.column("out_id").to_pylist()) <= blocks
    assert set(flow.column("in_table").to_pylist()) == {"instruction"}


def test_metadata_and_self_description(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    meta = profile.metadata
    assert meta["profile_schema_version"] == PROFILE_SCHEMA_VERSION
    assert meta["is_simulation"] is True and meta["capture_complete"] is True
    assert meta["instance_type"] == "trn1.2xlarge"
    assert meta["tensor_engine_num_rows"] == NC_V2.pe_rows
    assert abs(meta["tensor_engine_clock_freq"] - NC_V2.pe_clock_hz / 1e9) < 1e-6
    assert abs(meta["hbm_ddr_bandwidth"] - NC_V2.hbm_bytes_per_s) / NC_V2.hbm_bytes_per_s < 1e-6
    instr = profile.table("Instruction", ["start_ts", "end_ts"])
    assert meta["first_hw_timestamp"] == min(instr.column("start_ts").to_pylist())
    assert meta["last_hw_timestamp"] >= max(instr.column("end_ts").to_pylist())
    fields = profile.table("SchemaFields")
    listed = set(zip(fields.column("table_name").to_pylist(), fields.column("field_name").to_pylist()))
    for name in profile.tables:
        for f in SCHEMA.tables[name].fields:
            assert (name, f.name) in listed
    executions = profile.table("ExecutionInfo").to_pylist()
    assert [e["execution_index"] for e in executions] == list(range(EXECUTIONS))
    assert executions[0]["execution_start_ts"] == 0
    assert executions[0]["neff_name"] == recorded.program.graph.name


def test_stack_frames_resolve_to_source_lines(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    frames = {r["id"]: r for r in profile.table("StackFrame").to_pylist()}
    locations = {r["id"]: r for r in profile.table("StackFrameFileLocation").to_pylist()}
    files = {r["id"]: r["name"] for r in profile.table("StackFrameFileName").to_pylist()}
    functions = {r["id"]: r["name"] for r in profile.table("StackFrameFunctionName").to_pylist()}
    instr = profile.table("Instruction", ["stack_frame_ids", "bir_debug_info_source_location"])
    row = next(r for r in instr.to_pylist() if r["stack_frame_ids"])
    chain = [str(i) for i in eval_free_list(row["stack_frame_ids"])]
    innermost = locations[str(frames[chain[-1]]["file_location_id"])]
    source = f"{files[str(innermost['file_name_id'])]}:{innermost['line_number']}"
    assert source == row["bir_debug_info_source_location"]
    assert functions[str(innermost["function_name_id"])]
    for parent, child in itertools.pairwise(chain):
        assert frames[child]["parent_frame_id"] == parent
    assert frames[chain[0]]["parent_frame_id"] == "0"


def eval_free_list(text: str) -> list[int]:
    """``[1, 2, 3]`` -> [1, 2, 3] without eval (profile content is data, never code)."""
    return [int(x) for x in text.strip("[]").split(",") if x.strip()]


def merged_spans(intervals: list[tuple[int, int]]) -> list[list[int]]:
    """Union of intervals, computed here independently of the DuckDB rollup."""
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def test_hlo_rollup_matches_an_independent_union(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    hlo = profile.table("HloInstruction").to_pylist()
    instr = profile.table("Instruction", ["raw_hlo_id", "id", "start_ts", "end_ts"]).to_pylist()
    packets = profile.table("DmaPacket", ["raw_hlo_id", "packet_aggregation_id", "start_ts", "end_ts",
                                          "hbm_read_bytes", "hbm_write_bytes"]).to_pylist()
    runs = sorted({r["modular_flow_invocation_idx"] for r in hlo})
    assert runs == list(range(EXECUTIONS))
    per_run = recorded.program.n_nodes  # ids of execution k are [k * n_nodes, (k + 1) * n_nodes)
    busiest = max((r for r in hlo if r["modular_flow_invocation_idx"] == 1),
                  key=lambda r: len(eval_free_nested(r["time_intervals"])))
    op = busiest["raw_hlo_id"]
    events = [(r["start_ts"], r["end_ts"]) for r in instr
              if r["raw_hlo_id"] == op and r["id"] // per_run == 1]
    events += [(r["start_ts"], r["end_ts"]) for r in packets
               if r["raw_hlo_id"] == op and r["packet_aggregation_id"] // per_run == 1]
    assert eval_free_nested(busiest["time_intervals"]) == merged_spans(events)
    assert busiest["start_ts"] == min(s for s, _ in events) and busiest["end_ts"] == max(e for _, e in events)
    hbm = sum(r["hbm_read_bytes"] + r["hbm_write_bytes"] for r in packets
              if r["raw_hlo_id"] == op and r["packet_aggregation_id"] // per_run == 1)
    assert sum(busiest["hbm_transfer_size_per_interval"]) == hbm
    assert busiest["hlo_name"] == recorded.program.graph.ops[op & 0xFFFFFFFF].name
    assert len(busiest["element_count_per_interval"]) == len(busiest["hbm_transfer_size_per_interval"])


def test_framework_nodes_form_the_layer_tree(recorded: Recorded) -> None:
    profile = open_profile(recorded.path)
    nodes = {r["node_name"]: r for r in profile.table("FrameworkNode").to_pylist()}
    layers = {op.layer for op in recorded.program.graph.ops if op.layer}
    assert layers <= set(nodes)
    roots = [n for n, r in nodes.items() if r["parent_name"] == ""]
    assert roots == ["encoder"]
    root = nodes["encoder"]
    instr = profile.table("Instruction", ["layer", "engine"])
    attributed = pa.compute.sum(pa.compute.is_valid(instr.column("layer"))).as_py()
    counted = sum(root[f"{e}_engine_instruction_count"]
                  for e in ("tensor", "vector", "scalar", "gpsimd", "sync"))
    assert counted == attributed
    for name, row in nodes.items():
        if row["parent_name"]:
            assert name.startswith(row["parent_name"] + "/")
            assert name in nodes[row["parent_name"]]["children_names"]
        assert row["start_ts"] <= row["end_ts"]


def eval_free_nested(text: str) -> list[list[int]]:
    """``[[1, 10], [20, 50]]`` -> [[1, 10], [20, 50]] without eval."""
    inner = text.strip()[1:-1].strip()
    if not inner:
        return []
    return [[int(x) for x in pair.strip(" []").split(",")] for pair in inner.split("],")]
