"""A training step's profile: one program per step of rank 0 with forward / backward /
gradient_sync / optimizer as the hierarchy's levels, its collectives (TP inside the layers, DP
gradient buckets) on the CC-core with their compute overlap, the step row the figures read, and the
system profile's step marks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import neuroncore as nc
from collectors.device_profile import profile
from collectors.system import RuntimeEventLog
from formats import open_profile
from formats.figures import training_step_figures
from neuroncore.events import EventSink
from neuroncore.parallel.train_step import LEVELS, TrainingStepRun, step_graph
from neuroncore.parallel.training import PlanError
from neuroncore.workloads.training import get_train


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainingStepRun, list, RuntimeEventLog]:
    out = tmp_path_factory.mktemp("train") / "device"
    sink = EventSink()
    events = RuntimeEventLog("i-test")
    sink.subscribe(events)
    model, plan = get_train("llama-train").configure(None, tp=2, dp=16, zero1=True, seq=128, global_batch=32)
    with profile(out, nth_exec=2, sink=sink) as collector:
        run = TrainingStepRun.load(model, plan, nc.Instance("trn1.32xlarge", sink=sink))
        results = [run.execute() for _ in range(2)]
    assert [p.execution for p in collector.profiles] == [2]
    return collector.profiles[0].path, run, results, events


def test_the_step_program_has_the_levels_of_a_training_step(captured) -> None:
    _, run, _, _ = captured
    layers = {op.layer.split("/")[1] for op in run.program.graph.ops if op.layer.count("/") >= 1}
    assert set(LEVELS) <= layers
    ops = run.program.graph.ops
    tp = Counter(op.opcode for op in ops if op.attrs.get("group") == "tp")
    # sequence parallel (Llama's default, as NxD runs it), per micro-batch (2): the embedding's
    # reduce-scatter; 2 layers x (forward: 2 all-gathers + 2 reduce-scatters; backward: 4 + 2); the
    # head's all-gather, reduce-scatter and the vocab-parallel cross-entropy's three all-reduces (the
    # row max, the sum of exponentials and the target's logit, as Megatron's)
    assert tp == {"all-gather": 2 * (2 * 6 + 1), "reduce-scatter": 2 * (1 + 2 * 4 + 1), "all-reduce": 2 * 3}
    dp = [op for op in ops if op.attrs.get("group") == "dp"]
    assert {op.opcode for op in dp} == {"reduce-scatter", "all-gather"}
    assert all(op.layer.startswith("model/gradient_sync/") for op in dp)


def test_the_optimizer_ops_name_a_synthetic_source_not_their_caller(captured) -> None:
    """No user line runs a built-in step's AdamW: its ops say ``<optimizer AdamW>`` rather than the
    line that happened to build the program (``collectors/capture.py:176`` under capture)."""
    path, run, _, _ = captured
    update = [op for op in run.program.graph.ops if op.layer.startswith("model/optimizer/")]
    assert update and {op.frames[-1].file for op in update} == {"<optimizer AdamW>"}
    assert "<optimizer AdamW>" in open_profile(path).table("StackFrameFileName").column("name").to_pylist()


def test_profile_holds_the_step_and_its_collectives_with_overlap(captured) -> None:
    path, run, results, _ = captured
    p = open_profile(path)
    assert not p.warnings
    step = p.table("TrainingStep").to_pylist()
    assert len(step) == 1 and step[0]["step"] == 2
    row = step[0]
    assert row["global_batch"] == 32 and row["seq"] == 128 and row["ranks"] == 32
    assert row["forward_ns"] > 0 and row["backward_ns"] > row["forward_ns"] and row["optimizer_ns"] > 0
    result = results[1][0]
    assert row["step_time_ns"] == result.end_ns - result.start_ns
    fig = training_step_figures(row["step_time_ns"], row["global_batch"], row["seq"], row["model_flops"],
                                row["ranks"], row["peak_flops_per_rank"])
    assert fig.mfu is not None and 0 < fig.mfu < 1 and fig.seq_per_s > 0
    cc = p.table("TrainingCollective").to_pylist()
    ccop = p.table("CcOp")
    assert len(cc) == ccop.num_rows == len(run.program.collective_nodes)
    assert {c["replica_group_kind"] for c in cc} == {"tp", "dp"}
    assert {c["operation"] for c in cc} >= {"AllReduce", "ReduceScatter", "AllGather"}
    for c in cc:
        assert 0 <= c["overlap_ns"] <= c["end_ts"] - c["start_ts"]
    # the hierarchy: levels under model/ with the layers inside
    layers = set(p.table("Instruction", ["layer"]).column("layer").to_pylist())
    assert any(x.startswith("model/backward/microbatch.1/layers.0/") for x in layers if x)
    assert any(x.startswith("model/optimizer/bucket.0") for x in layers if x)


def test_system_profile_marks_each_step(captured) -> None:
    _, _, _, events = captured
    names = events.rows["name"]
    steps = [i for i, n in enumerate(names) if n == "train_step"]
    assert len(steps) == 2
    assert all(events.rows["duration_ns"][i] > 0 for i in steps)


def test_data_parallel_gradient_buckets_overlap_the_backward() -> None:
    """Without ZeRO-1, with small buckets... the head's bucket is ready before the layers' backward
    ends, so its all-reduce overlaps compute."""
    model, plan = get_train("llama-train").configure(None, tp=1, dp=32, seq=128, global_batch=32)
    run = TrainingStepRun.load(model, plan, nc.Instance("trn1.32xlarge", sink=EventSink()))
    _, rows, levels = run.execute()
    dp = [r for r in rows if r.group == "dp"]
    assert dp and all(r.operation == "AllReduce" for r in dp)
    assert set(levels) == set(LEVELS)


def test_pipeline_stages_are_programs_of_their_own_in_1f1b_order() -> None:
    """pp 2: each stage's rank 0 runs its own program (stage 0 the embedding and its layers, the last
    the head too), its micro-batches in 1F1B order, sends and receives as collective-permutes under
    model/pipeline; a receive waits for its send, so stage 0 idles in the middle (the bubble)."""
    model, plan = get_train("llama-train").configure(None, tp=2, pp=2, seq=128, global_batch=32)
    assert plan.micro_batches == 4
    run = TrainingStepRun.load(model, plan, nc.Instance("trn1.32xlarge", sink=EventSink()))
    assert len(run.stages) == 2
    for stage, st in enumerate(run.stages):
        ops = st.program.graph.ops
        permutes = [op for op in ops if op.opcode == "collective-permute"]
        assert len(permutes) == 2 * plan.micro_batches  # one send and one receive per micro-batch
        assert all(op.layer.startswith("model/pipeline/microbatch.") for op in permutes)
        roles = [(op.attrs["pp_kind"], op.attrs["pp_role"]) for op in permutes]
        if stage == 0:
            assert roles[:3] == [("activation", "send"), ("activation", "send"), ("gradient", "recv")]
            assert any(op.layer.startswith("model/forward/microbatch.0/embed_tokens") for op in ops)
        else:
            assert roles[:2] == [("activation", "recv"), ("gradient", "send")]
        layer = stage  # 2 layers, one per stage
        assert any(f"/layers.{layer}/" in op.layer for op in ops)
        assert not any(f"/layers.{1 - layer}/" in op.layer for op in ops)
    with pytest.raises(PlanError, match="stage 2 is not a stage of a 2-stage pipeline"):
        step_graph(model, plan, 2)
    _, rows, levels = run.execute()
    stage0, stage1 = run.last_results
    assert stage0.core != stage1.core and stage0.start_ns == stage1.start_ns
    assert run.step_time_ns == max(stage0.end_ns, stage1.end_ns) - stage0.start_ns
    pp_rows = [r for r in rows if r.group == "pp"]
    assert len(pp_rows) == 8 and all(r.operation == "Permute" for r in pp_rows)
    # stage 0's first gradient receive waits for stage 1's first backward: longer than a transfer
    recv = [r for r in pp_rows if r.end_ns - r.start_ns > 10 * min(x.end_ns - x.start_ns for x in pp_rows)]
    assert recv
    assert set(levels) == set(LEVELS) and levels["backward"] > 0
    # the modelled single-stage view equals a pp-1 program when pp is 1 (no permutes at all)
    model1, plan1 = get_train("llama-train").configure(None, tp=2, seq=128, global_batch=32)
    assert not any(op.opcode == "collective-permute" for op in step_graph(model1, plan1).ops)


def test_capture_of_a_training_workload_and_its_summary(tmp_path: Path) -> None:
    """``neuron-profile capture --workload llama-train`` through the real entry point: the warm-up
    step is skipped (default --profile-nth-exec 2), the summary shows the training block."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(repo)}
    out = tmp_path / "cap"
    done = subprocess.run([sys.executable, "-m", "explorer.profile_cli", "capture", "--workload",
                           "llama-train", "--tp", "2", "--set", "seq=128", "--set", "global_batch=32",
                           "-o", str(out)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "seq/s" in done.stdout and "MFU" in done.stdout and "gradient synchronisation" in done.stdout
    profiles = sorted((out / "device").glob("model=*/core=0/execution=*"))
    assert [p.name for p in profiles] == ["execution=2"]
    view = subprocess.run([sys.executable, "-m", "explorer.profile_cli", "view", "--output-format",
                           "summary-text", str(profiles[0])], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert view.returncode == 0, view.stderr
    text = view.stdout
    assert "training step" in text and "training MFU" in text and "step levels" in text
    assert "grad sync cc" in text and "overlapped with compute" in text
    bad = subprocess.run([sys.executable, "-m", "explorer.profile_cli", "capture", "--workload",
                          "llama-train",
                          "--tp", "2", "--set", "pp=4", "--set", "seq=128", "-o", str(tmp_path / "bad")],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "pp 4 does not divide 2 layers" in bad.stderr


def test_capture_of_a_pipeline_parallel_training_workload(tmp_path: Path) -> None:
    """``capture --workload llama-train --set pp=2`` through the real entry point: one profile per
    stage (each stage's rank 0 on its own core), each with its TrainingStep row (the pipeline's step
    time) and its sends/receives as CcOp / TrainingCollective rows of group pp under model/pipeline,
    next to the forward / backward / gradient_sync / optimizer levels; stage 1 idles until its
    first activation arrives (the bubble)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(repo)}
    out = tmp_path / "cap"
    done = subprocess.run([sys.executable, "-m", "explorer.profile_cli", "capture", "--workload",
                           "llama-train", "--tp", "2", "--set", "pp=2", "--set", "seq=128",
                           "--set", "global_batch=32", "--device-only", "-o", str(out)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pipeline: 2 stages, 1F1B over 4 micro-batches" in done.stdout
    profiles = sorted((out / "device").glob("model=*/core=*/execution=2"))
    assert len(profiles) == 2
    opened = [open_profile(p) for p in profiles]
    steps = [p.table("TrainingStep").to_pylist()[0] for p in opened]
    assert steps[0]["step_time_ns"] == steps[1]["step_time_ns"]
    assert steps[0]["start_ts"] == steps[1]["start_ts"]
    firsts = []
    for p in opened:
        assert not p.warnings
        cc = p.table("TrainingCollective").to_pylist()
        pp = [c for c in cc if c["replica_group_kind"] == "pp"]
        assert len(pp) == 8 and {c["operation"] for c in pp} == {"Permute"}
        assert p.table("CcOp").num_rows == len(cc)
        layers = {x for x in p.table("Instruction", ["layer"]).column("layer").to_pylist() if x}
        for level in ("pipeline", *LEVELS):
            assert any(x.startswith(f"model/{level}/") for x in layers), level
        rows = p.table("Instruction", ["start_ts", "engine", "layer"]).to_pylist()
        norm = [r["start_ts"] for r in rows if r["engine"] != "Sync" and (r["layer"] or "").startswith(
            "model/forward/microbatch.0/") and "/input_layernorm" in r["layer"]]
        firsts.append(min(norm))  # the first layer's first read of its input
    # stage 1 starts on micro-batch 0 only once stage 0's activation has arrived: after the send
    send = min(c["start_ts"] for c in opened[0].table("CcOp").to_pylist() if c["operation"] == "Permute")
    assert firsts[0] < send < firsts[1]
    view = subprocess.run([sys.executable, "-m", "explorer.profile_cli", "view", "--output-format",
                           "summary-text", str(profiles[0])], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert view.returncode == 0, view.stderr
    assert "pipeline cc     8 ops" in view.stdout and "training step" in view.stdout


def test_training_block_has_no_tokens_for_a_model_without_a_sequence(tmp_path: Path) -> None:
    """An MLP's step (seq 0: feature vectors, no tokens) shows seq/s and no '0 tokens/s'; a
    sequence model's shows both."""
    import numpy as np

    from formats.headline import training_lines
    from formats.reader import open_profile
    from tests.fixtures.hand_profiles import filled, write_profile

    def first_line(seq: int) -> str:
        step = filled("TrainingStep", {"step_time_ns": np.array([1000]), "global_batch": np.array([32]),
                                       "seq": np.array([seq]), "model_flops": np.array([10 ** 6])})
        root = write_profile(tmp_path / f"seq{seq}", {"TrainingStep": step}, summary=False)
        return training_lines(open_profile(root))[0]

    mlp = first_line(0)
    assert "seq/s" in mlp and "tokens/s" not in mlp
    assert "4,096,000,000 tokens/s" in first_line(128)


def test_every_view_shows_the_same_training_step(captured) -> None:
    """summary-text's training line, the viewer's summary pane and the GUI's Summary tab show the
    one training step (the Summary's training columns): before, only summary-text showed it."""
    from explorer.viewer.summary_figures import figures
    from formats.headline import training_lines
    from formats.summary import summary_row
    from formats.units import fmt_ns, fmt_pct

    path, _, _, _ = captured
    profile = open_profile(path)
    row = summary_row(profile)
    step, mfu = fmt_ns(row["training_step_time"] * 1e9), row["training_mfu_percent"]
    seq = f"{row['training_seq_per_s']:,.1f} seq/s"
    text = training_lines(profile)[0]
    assert text.startswith(f"training step   {step} · {seq}") and f"training MFU {fmt_pct(mfu)}" in text
    pane = {f.label: f.value for f in figures(row)}
    assert pane["Step"] == f"{step} · {seq}" and pane["Train MFU"] == fmt_pct(mfu)
    pytest.importorskip("PySide6")
    from explorer.gui.mainwindow import _training_lines

    class Loaded:
        pass

    loaded = Loaded()
    loaded.profile = profile  # type: ignore[attr-defined]
    gui = dict(_training_lines(loaded))
    assert gui["training step time"] == step and gui["training seq/s"] == seq.split()[0]
    assert gui["training MFU"] == fmt_pct(mfu) == pane["Train MFU"]  # one string in every view
