"""The analyses (``formats.analysis``, ``formats.critical_path``): a hand-built program with a known
critical path and idle causes, captured workloads (path length = device time, idle causes sum to idle
time, the SQL views agree with the compiled implementation), a real-layout profile without our extra
tables, and ``neuron-profile analyze`` through its real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from formats.analysis import analyze
from formats.query import open_query
from formats.reader import open_profile
from tests.fixtures.hand_profiles import filled, write_profile
from tests.fixtures.real_layout import Shape, real_layout_profile


def _chain_tables(flows: bool) -> dict[str, dict[str, Any]]:
    """One execution [0, 1000): Sync 6 [0,10) triggers DMA 100 (qSyncIO0, [0,300)); MATMUL 1
    [300,500) waits on the DMA; Vector 2 [0,100); Vector 3 [500,700) waits on 1; Scalar 4 [100,200)
    waits on 2; Scalar 5 [700,1000) waits on 3. ``flows=False`` leaves out the Flow table."""
    instr = filled("Instruction", {
        "start_ts": np.array([300, 0, 500, 100, 700, 0]),
        "end_ts": np.array([500, 100, 700, 200, 1000, 10]),
        "engine": ["Tensor", "Vector", "Vector", "Scalar", "Scalar", "Sync"],
        "timeline_track": ["TensorMatrix", "Vector", "Vector", "Scalar", "Scalar", "Sync"],
        "opcode": ["MATMUL", "TENSOR_TENSOR", "TENSOR_TENSOR", "ACTIVATE", "ACTIVATE", "WRITE"],
        "id": np.array([1, 2, 3, 4, 5, 6]),
        "hlo_name": ["dot.1", "add.2", "add.3", "exp.4", "exp.5", "copy.6"],
        "layer": ["m/mlp/down_proj", "m/attn", "m/mlp", "m/attn", "m/mlp", "m"],
        "bir_debug_info_source_location": ["m.py:10", "m.py:20", "m.py:30", "m.py:40", "m.py:50", "m.py:60"],
    })
    tables: dict[str, dict[str, Any]] = {
        "Instruction": instr,
        "DmaPacket": filled("DmaPacket", {
            "start_ts": np.array([0, 0]), "end_ts": np.array([300, 300]), "id": np.array([1, 2]),
            "packet_aggregation_id": np.array([100, 100]), "transfer_bytes": np.array([0, 4096]),
            "read_bytes": np.array([0, 4096]), "write_bytes": np.array([0, 4096]),
            "queue_type": ["data", "data"], "queue_name": ["qSyncIO0", "qSyncIO0"]}),
        "ExecutionInfo": {"execution_index": pa.array([0], pa.int32()), "neff_name": ["chain"],
                          "execution_start_ts": [0], "execution_end_ts": [1000]},
    }
    if flows:
        edges = [("instruction", 6, "dma_block", 100, "DMA_TRIGGER"),
                 ("dma_block", 100, "instruction", 1, "SEMAPHORE"),
                 ("instruction", 1, "instruction", 3, "SEMAPHORE"),
                 ("instruction", 2, "instruction", 4, "SEMAPHORE"),
                 ("instruction", 3, "instruction", 5, "SEMAPHORE")]
        tables["Flow"] = {"in_table": [e[0] for e in edges], "in_id": np.array([e[1] for e in edges]),
                          "out_table": [e[2] for e in edges], "out_id": np.array([e[3] for e in edges]),
                          "dependency_type": [e[4] for e in edges]}
    return tables


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_profile(tmp_path_factory.mktemp("chain") / "p", _chain_tables(True), summary=False,
                         metadata={"first_hw_timestamp": 0, "last_hw_timestamp": 1000})


def test_hand_built_chain_has_the_known_critical_path(chain: Path) -> None:
    """Scalar 5 <- Vector 3 <- MATMUL 1 <- DMA 100 (started before its trigger ended: no predecessor)
    = 300 + 200 + 200 + 300 = 1000 ns."""
    a = analyze(open_profile(chain))
    path = a.critical_path
    assert path is not None
    assert a.device_time_ns == 1000 and path.length_ns == 1000
    assert path.by_queue == {"qSyncIO0": 300}
    assert path.by_engine == {"Scalar": 300, "Tensor": 200, "Vector": 200}
    assert path.implicit_events == 0
    assert list(path.event_ids) == [5, 3, 1, 100]
    assert [c.name for c in path.top][:2] == ["dma qSyncIO0", "exp.5"]
    assert path.top[1].source == "m.py:50" and path.top[1].layer == "m/mlp"
    assert path.by_layer_kind == {"mlp": 500, "down_proj": 200}
    share = a.to_json()["critical_path"]["share"]
    assert share["queue"] == {"qSyncIO0": 0.3} and share["engine"]["Scalar"] == 0.3


def test_hand_built_chain_idle_causes(chain: Path) -> None:
    a = analyze(open_profile(chain))
    assert a.idle["Tensor"].by_cause == {"starved": 500, "dma:qSyncIO0": 300}
    assert a.idle["Vector"].by_cause == {"engine:Tensor": 400, "starved": 300}
    assert a.idle["Scalar"].by_cause == {"engine:Vector": 600}
    assert a.idle["Sync"].by_cause == {"starved": 990}
    assert a.idle["Tensor"].by_op == {"dot.1": 300}
    for report in a.idle.values():
        assert sum(report.by_cause.values()) == report.total_ns
    assert a.findings and a.findings[0].time_ns >= a.findings[-1].time_ns


def test_hand_built_temporal_breakdown_and_dma_queue(chain: Path) -> None:
    """Instructions cover [0,200) and [300,1000) = 900 ns; the DMA [0,300) adds [200,300) = 100 ns of
    DMA-only time; 200 of its 300 ns overlap compute."""
    a = analyze(open_profile(chain))
    t = a.temporal
    assert t is not None
    assert (t.compute_ns, t.dma_only_ns, t.collective_only_ns, t.idle_ns) == (900, 100, 0, 0)
    assert t.dma_overlap == pytest.approx(200 / 300) and t.collective_overlap is None
    (queue,) = a.dma_queues
    got = (queue.queue, queue.transfers, queue.bytes, queue.packets, queue.small_transfers, queue.active_ns)
    assert got == ("qSyncIO0", 1, 4096, 2, 1, 300)
    from formats.analyze_command import analyze_dir, text_lines

    (line,) = [t for t in text_lines(analyze_dir(str(chain))) if t.lstrip().startswith("qSyncIO0")]
    assert " 1 transfer " in line and "transfers" not in line  # one transfer, not "1 transfers"


def test_throttling_the_profile_recorded_is_a_finding(tmp_path: Path) -> None:
    tables = _chain_tables(True)
    tables["Throttle"] = {"timestamp": np.array([300, 600]), "duration": np.array([100, 50]),
                          "k": pa.array([1, 1], pa.int32()), "n": pa.array([2, 2], pa.int32()),
                          "type": ["activity_0", "activity_0"]}
    root = write_profile(tmp_path / "p", tables, summary=False,
                         metadata={"first_hw_timestamp": 0, "last_hw_timestamp": 1000})
    found = [f for f in analyze(open_profile(root)).findings if f.title == "Power throttling"]
    # 150 ns of throttling; its cost: MATMUL 1 [300, 500) ran 100 ns of it at half rate, 50 ns lost
    assert len(found) == 1 and found[0].time_ns == 50 and "50.0%" in found[0].evidence
    assert "150 ns" in found[0].evidence and "ran 50 ns longer" in found[0].evidence


def test_without_flow_the_path_is_inferred_from_timing(tmp_path: Path) -> None:
    path_dir = write_profile(tmp_path / "p", _chain_tables(False), summary=False,
                             metadata={"first_hw_timestamp": 0, "last_hw_timestamp": 1000})
    a = analyze(open_profile(path_dir))
    assert a.critical_path is not None and a.critical_path.length_ns == 1000
    assert a.critical_path.implicit_events > 0
    assert any("Flow" in reason for _, reason in a.skipped)
    assert a.idle["Tensor"].by_cause["dma:qSyncIO0"] == 300


def test_sql_views_reproduce_the_hand_built_answer(chain: Path) -> None:
    with open_query(chain) as q:
        rows = q.sql("SELECT id, contribution_ns FROM analysis_critical_path ORDER BY step").fetchall()
        assert rows == [(5, 300), (3, 200), (1, 200), (100, 300)]
        idle = dict(q.sql("SELECT cause, sum(idle_ns)::BIGINT FROM analysis_idle WHERE engine = 'Vector' "
                          "GROUP BY 1").fetchall())
        assert idle == {"engine:Tensor": 400, "starved": 300}


def _sql_numbers(root: Path) -> tuple[int, dict[str, dict[str, int]], dict[str, int]]:
    with open_query(root) as q:
        length = q.sql("SELECT sum(contribution_ns)::BIGINT FROM analysis_critical_path").fetchall()[0][0]
        idle: dict[str, dict[str, int]] = {}
        for engine, cause, ns in q.sql("SELECT engine, cause, sum(idle_ns)::BIGINT FROM analysis_idle "
                                       "GROUP BY 1, 2").fetchall():
            idle.setdefault(engine, {})[cause] = int(ns)
        lanes = dict(q.sql("SELECT lane, sum(contribution_ns)::BIGINT FROM analysis_critical_path "
                           "WHERE kind_name = 'dma_block' GROUP BY 1").fetchall())
    return int(length), idle, {k: int(v) for k, v in lanes.items()}


def test_captured_workload_path_equals_device_time(recorded: Any) -> None:
    """bert-layer, two executions in one profile: the path tiles both, idle causes add up, and the SQL
    views give the same numbers."""
    a = analyze(open_profile(recorded.path))
    path = a.critical_path
    assert path is not None
    assert path.length_ns == a.device_time_ns == sum(r.device_time_ns for r in recorded.results)
    assert path.implicit_events < path.events / 2  # most links come from Flow edges
    for report in a.idle.values():
        assert sum(report.by_cause.values()) == report.total_ns
        assert 0 < report.total_ns <= a.device_time_ns
    t = a.temporal
    assert t is not None
    assert t.compute_ns + t.dma_only_ns + t.collective_only_ns + t.idle_ns == a.device_time_ns
    dot = next(o for o in a.bottom_up if o.kind == "dot")
    assert dot.flops > 0 and dot.intensity is not None and dot.roofline_flops_per_s is not None
    assert dot.achieved_flops_per_s is not None and dot.achieved_flops_per_s <= dot.roofline_flops_per_s
    length, idle, queues = _sql_numbers(recorded.path)
    assert length == path.length_ns
    assert {e: r.by_cause for e, r in a.idle.items()} == idle
    assert queues == path.by_queue
    assert sum(sum(v.values()) for v in a.to_json()["critical_path"]["share"].values()) == pytest.approx(1.0)


def test_tensor_parallel_ranks_have_collectives_on_the_path(tp_dataset: Any) -> None:
    profiles = sorted(p.parent for p in tp_dataset.root.rglob("Instruction.parquet"))
    assert len(profiles) == 2
    for root in profiles:
        a = analyze(open_profile(root))
        assert a.critical_path is not None and a.critical_path.length_ns == a.device_time_ns
        assert a.critical_path.by_collective  # the all-reduces are on it, linked by their Flow edges
        flow = open_profile(root).table("Flow", ["in_table", "out_table"]).to_pylist()
        assert {"in_table": "cc_op", "out_table": "instruction"} in flow


def test_real_layout_profile_without_our_tables_degrades_with_a_message(tmp_path: Path) -> None:
    root = real_layout_profile(tmp_path, Shape.LLAMA)
    a = analyze(open_profile(root))
    assert a.critical_path is not None and a.critical_path.length_ns == a.device_time_ns
    assert any("Flow" in reason for _, reason in a.skipped)
    for report in a.idle.values():
        assert sum(report.by_cause.values()) == report.total_ns


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "explorer.profile_cli", "analyze", *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_json_and_text(chain: Path) -> None:
    done = _cli(str(chain), "--output-format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["device_time_ns"] == data["critical_path"]["length_ns"] == 1000
    assert data["idle"]["Tensor"]["total_ns"] == 800
    assert data["idle"]["Tensor"]["by_cause"] == {"starved": 500, "dma:qSyncIO0": 300}
    text = _cli(str(chain))
    assert text.returncode == 0 and "critical path 1 µs = device time" in text.stdout
    assert "idle by cause:" in text.stdout


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    done = _cli(str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _cli(str(empty))
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_a_slowed_rank_is_found_as_the_straggler(tmp_path: Path) -> None:
    """--rank-slowdown's Python keyword: rank 1 twice as slow arrives last at every collective, and the
    analysis names it with the cause read from its own profile."""
    import neuroncore as nc
    from collectors.device_profile import profile
    from formats.analyze_command import analyze_dir
    from neuroncore import workloads
    from neuroncore.parallel import TensorParallelModel

    workload = workloads.get("llama-decode")
    graph = workload.build(**workload.options(None, tp_degree=2, layers=1))
    sink = nc.EventSink()
    instance = nc.Instance("trn1.32xlarge", sink=sink)
    root = tmp_path / "device"
    with profile(root, sink=sink):
        model = TensorParallelModel.load(graph, instance, tp_degree=2, rank_slowdown={1: 2.0})
        result = model.execute(None, timing_only=True)
    assert result.ranks[1].device_time_ns >= result.ranks[0].device_time_ns
    report = analyze_dir(str(root))
    ranks = report["ranks"]
    assert ranks is not None and ranks.stragglers
    assert all("core=1" in s.rank for s in ranks.stragglers)
    assert all("2.00x" in s.cause for s in ranks.stragglers)
    assert ranks.wait_ns[next(n for n in ranks.wait_ns if "core=0" in n)] > 0
    for a in report["profiles"].values():
        assert a.critical_path is not None and a.critical_path.length_ns == a.device_time_ns
    from formats.analyze_command import to_json
    data = to_json(report)
    assert {"rank", "collective", "late_ns", "cause"} <= set(data["stragglers"][0])


def test_rank_slowdown_is_checked() -> None:
    from neuroncore.parallel.group import check_slowdown, parse_slowdown
    from neuroncore.parallel.sharding import ShardingError

    assert parse_slowdown(["1=2.5"]) == {1: 2.5}
    with pytest.raises(ValueError, match="RANK=FACTOR"):
        parse_slowdown(["two"])
    with pytest.raises(ShardingError, match=r"ranks 0\.\.1"):
        check_slowdown({2: 2.0}, 2)
    with pytest.raises(ShardingError, match=">= 1"):
        check_slowdown({1: 0.5}, 2)


def test_capture_directory_ranks_are_device_profiles_only() -> None:
    """A capture directory (device/ + system/): the ranks are the device profiles; the host-side
    system profile is named as such, not analysed, and alone it is a one-line error."""
    capture = Path(__file__).resolve().parents[2] / "sample_profiles" / "llama-decode-tp2"
    text = _cli(str(capture))
    assert text.returncode == 0, text.stderr
    assert "2 ranks" in text.stdout and "system: device time" not in text.stdout
    assert "system profile (host side: not a rank, not analysed): system" in text.stdout
    data = json.loads(_cli(str(capture), "--output-format", "json").stdout)
    assert data["system_profiles"] == ["system"]
    assert sorted(data["profiles"]) == [f"device/model=llama_decode/core={r}/execution=2" for r in (0, 1)]
    assert sorted(data["ranks"]["device_time_ns"]) == sorted(data["profiles"])
    alone = _cli(str(capture / "system"))
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1 and "device/" in alone.stderr


def test_roofline_line_without_a_bound_says_why() -> None:
    """A dot whose operands never touched HBM (a training step's backward) has no intensity and no
    roofline: the text says so instead of '-/s, --bound'."""
    from formats.analyze_command import roofline_line
    from formats.breakdown import OpKind

    on_chip = OpKind("dot", 3, 10, 1000, 1000, 1000, 4_000_000, 0, 91.8e12, 820e9)
    line = roofline_line(on_chip)
    assert "--bound" not in line and "-/s" not in line
    assert "4 TFLOP/s" in line and "no HBM bytes" in line and "no roofline bound" in line
    from_hbm = OpKind("dot", 3, 10, 1000, 1000, 1000, 4_000_000, 40_000, 91.8e12, 820e9)
    assert "memory-bound" in roofline_line(from_hbm) and "of 82 TFLOP/s" in roofline_line(from_hbm)


def test_different_programs_on_one_core_are_not_ranks(tmp_path: Path) -> None:
    """A generation's capture: context encoding and token generation on core 0 are two programs,
    not two ranks; under tp 2 each program's two cores are a rank group of their own."""
    from formats.analyze_command import analyze_dir, text_lines, to_json

    def write(root: Path, model: str, core: int) -> None:
        write_profile(root / f"device/model={model}/core={core}/execution=2", _chain_tables(True),
                      summary=False, metadata={"first_hw_timestamp": 0, "last_hw_timestamp": 1000})

    one = tmp_path / "one"
    write(one, "lm.context_encoding.32", 0)
    write(one, "lm.token_generation.32", 0)
    result = analyze_dir(str(one))
    assert len(result["profiles"]) == 2 and result["ranks"] is None and not result["rank_groups"]
    assert not any("ranks" in line for line in text_lines(result))
    tp = tmp_path / "tp"
    for model in ("ctx", "tok"):
        for core in (0, 1):
            write(tp, model, core)
    result = analyze_dir(str(tp))
    assert result["ranks"] is None and sorted(result["rank_groups"]) == ["model=ctx, execution=2",
                                                                         "model=tok, execution=2"]
    text = list(text_lines(result))
    assert "ranks of model=ctx, execution=2:" in text and text.count("2 ranks") == 2
    assert set(to_json(result)["rank_groups"]["model=tok, execution=2"]["ranks"]["device_time_ns"]) == {
        "device/model=tok/core=0/execution=2", "device/model=tok/core=1/execution=2"}
