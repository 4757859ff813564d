"""``neuron-profile capture -- python train.py`` of a script that trains with tensor parallelism and
with pipeline parallelism (real numerics): each rank's executions are profiled on its own core, the
tensor-parallel ranks with their all-reduces on the CC-core and the step's row (tp ranks), the
pipeline stages' forward and backward programs on their stages' cores, and each step's row (tp x pp
ranks) on the profile of the last stage's optimizer program, with the steps in the system profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")

from formats import open_profile
from formats.dataset import find_profiles

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "neuron-profile"

SCRIPT = '''
import torch
import torch.nn.functional as F
from neuroncore.parallel.pp_train import PipelineParallelTrainStep
from neuroncore.parallel.tp_train import TensorParallelTrainStep

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))

x, y = torch.randn(8, 16), torch.randn(8, 8)
tp_model = mlp()
tp = TensorParallelTrainStep(tp_model, torch.optim.AdamW(tp_model.parameters(), lr=1e-2), (x, y), tp=2,
                             loss_fn=F.mse_loss)
tp_losses = [float(tp(x, y)) for _ in range(3)]
pp_model = mlp()
pp = PipelineParallelTrainStep(pp_model, torch.optim.AdamW(pp_model.parameters(), lr=1e-2),
                               (x[:4], y[:4]), pp=2, micro_batches=2, loss_fn=F.mse_loss,
                               boundaries=[2])
pp_losses = [float(pp(x, y)) for _ in range(3)]
assert tp_losses[2] < tp_losses[0] and pp_losses[2] < pp_losses[0], (tp_losses, pp_losses)
print("trained", tp_losses, pp_losses)
'''


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("ptrain")
    script = root / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    command = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "explorer.profile_cli"]
    done = subprocess.run([*command, "capture", "-o", str(root / "out"), "--",
                           sys.executable, str(script)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    return root / "out", done


def test_parallel_training_scripts_are_captured_rank_by_rank(captured) -> None:
    out, done = captured
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    entries, skipped = find_profiles(out / "device")
    assert not skipped
    where = {(e.partitions["model"], e.partitions["core"]) for e in entries}
    # the tensor-parallel rank program on cores 0 and 1; the pipeline's stage programs on theirs
    assert {("Sequential_train_step", "0"), ("Sequential_train_step", "1")} <= where
    assert {("Sequential_stage0_forward", "0"), ("Sequential_stage0_backward", "0"),
            ("Sequential_stage1_forward_backward", "1")} <= where
    tp_rank0 = next(e.path for e in entries
                    if (e.partitions["model"], e.partitions["core"]) == ("Sequential_train_step", "0"))
    (row,) = pq.read_table(next(tp_rank0.glob("TrainingStep*.parquet"))).to_pylist()
    assert row["ranks"] == 2 and "/tp2pp1dp1/" in row["layout"] and row["step"] == 2
    profile = open_profile(tp_rank0)
    ops = set(profile.table("CcOp").column("operation").to_pylist())
    assert ops == {"AllReduce"}
    layers = {x for x in profile.table("Instruction", ["layer"]).column("layer").to_pylist() if x}
    assert any(x.startswith("model/backward/") for x in layers)
    assert any(x.startswith("model/optimizer/") for x in layers)
    # the pipeline's sends are collective-permutes of the sending stage's programs
    for model, core in (("Sequential_stage0_forward", "0"), ("Sequential_stage1_forward_backward", "1")):
        path = next(e.path for e in entries if (e.partitions["model"], e.partitions["core"]) == (model, core))
        assert open_profile(path).table("CcOp").column("operation").to_pylist() == ["Permute"]
    assert not open_profile(next(e.path for e in entries if e.partitions["model"] ==
                                 "Sequential_stage0_backward")).num_rows("CcOp")


def test_a_pipeline_step_has_its_row_summary_and_system_marks(captured) -> None:
    """The pipeline step's train_step record goes with the last stage's optimizer execution (one
    per step, so the default --profile-nth-exec 2 profiles step 2): its TrainingStep row spans
    every stage's executions, the Summary shows step time and throughput, and the system profile
    marks every step."""
    out, done = captured
    assert done.returncode == 0, done.stderr[-3000:]
    entries, _ = find_profiles(out / "device")
    path = next(e.path for e in entries
                if (e.partitions["model"], e.partitions["core"]) == ("Sequential_stage1_optimizer", "1"))
    (row,) = pq.read_table(next(path.glob("TrainingStep*.parquet"))).to_pylist()
    assert row["step"] == 2 and row["ranks"] == 2 and "/tp1pp2dp1/" in row["layout"]
    assert row["global_batch"] == 8 and row["model_flops"] > 0
    assert row["forward_ns"] > 0 and row["backward_ns"] > 0 and row["optimizer_ns"] > 0
    # the step spans both stages' programs: longer than the optimizer execution it is filed under
    execution = open_profile(path).table("Summary").to_pylist()[0]
    assert execution["training_step_time"] == pytest.approx(row["step_time_ns"] / 1e9)
    assert execution["training_seq_per_s"] == pytest.approx(8 / (row["step_time_ns"] / 1e9))
    assert row["step_time_ns"] > row["optimizer_ns"] * 2
    events = pq.read_table(next((out / "system").glob("SystemProfileEvents*.parquet"))).to_pylist()
    steps = [json.loads(e["extra_attributes_json"]) for e in events if e["name"] == "train_step"]
    assert sorted(s["step"] for s in steps if "/tp1pp2dp1/" in s["layout"]) == [1, 2, 3]
