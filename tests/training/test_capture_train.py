"""``neuron-profile capture -- python train.py``: a user's training script, unchanged, captured end
to end through the real entry point with the default ``--profile-nth-exec`` (the warm-up step is
skipped). One capture (module fixture) of a PyTorch step with gradient accumulation and a JAX step;
the tests read its profiles: forward / backward / optimizer as levels of the hierarchy, the step's
row in TrainingStep, the steps marked in the system profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")
pytest.importorskip("optax")

from formats import open_profile
from formats.dataset import capture_state, find_profiles

REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "neuron-profile"

SCRIPT = '''
import jax, jax.numpy as jnp, optax, torch
import torch.nn.functional as F
import neuroncore
from neuroncore.training import trace_jax_train_step

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

torch.manual_seed(0)
model = MLP()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
step = neuroncore.trace_train_step(model, optimizer, (x[:4], y[:4]), loss_fn=F.cross_entropy,
                                   accumulation_steps=2)
losses = [float(step(x, y)) for _ in range(3)]
assert losses[2] < losses[0], losses

def loss_fn(params, x, y):
    return optax.softmax_cross_entropy(x @ params["w"], jax.nn.one_hot(y, 4)).mean()

params = {"w": jnp.zeros((16, 4))}
jstep = trace_jax_train_step(loss_fn, params, optax.sgd(0.1), (jnp.ones((8, 16)), jnp.arange(8) % 4))
jlosses = [float(jstep(jnp.ones((8, 16)), jnp.arange(8) % 4)) for _ in range(3)]
print("trained", losses, jlosses)
'''


def neuron_profile(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    command = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "explorer.profile_cli"]
    return subprocess.run([*command, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("train")
    script = root / "train.py"
    script.write_text(SCRIPT)
    return root / "out", neuron_profile("capture", "-o", str(root / "out"), "--", sys.executable, str(script))


Captured = tuple[Path, subprocess.CompletedProcess[str]]


def test_the_training_script_runs_and_is_captured(captured: Captured) -> None:
    out, done = captured
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout and "Traceback" not in done.stderr
    entries, skipped = find_profiles(out / "device")
    assert not skipped
    # the accumulate and update programs of the PyTorch step, and the JAX step: each profiled at
    # its second execution (the default --profile-nth-exec 2: the warm-up step is skipped)
    assert sorted(e.partitions["model"] for e in entries) == [
        "MLP_accumulate", "MLP_train_step", "loss_fn_train_step"]
    for entry in entries:
        state = capture_state(entry.path)
        assert state.execution == 2 and not state.warm_up and not state.incomplete


def _profile(out: Path, model: str) -> Path:
    return next(e.path for e in find_profiles(out / "device")[0] if e.partitions["model"] == model)


@pytest.mark.parametrize("model", ["MLP_train_step", "loss_fn_train_step"])
def test_phases_are_levels_of_the_hierarchy(captured: tuple[Path, subprocess.CompletedProcess[str]],
                                            model: str) -> None:
    out, _ = captured
    nodes = pq.read_table(next(_profile(out, model).glob("FrameworkNode*.parquet"))).to_pylist()
    by_name = {n["node_name"]: n for n in nodes}
    phases = [p for p in ("forward", "backward", "optimizer") if f"model/{p}" in by_name]
    assert phases == ["forward", "backward", "optimizer"]
    for phase in phases:
        node = by_name[f"model/{phase}"]
        assert node["parent_name"] == "model" and node["instruction_count"] > 0
    if model == "MLP_train_step":  # layers inside each phase, as in an inference profile
        assert {"model/forward/fc1", "model/backward/fc1", "model/optimizer/fc1"} <= set(by_name)
        profile = open_profile(_profile(out, model))
        assert profile.num_rows("HloInstruction") > 0 and profile.num_rows("Instruction") > 0


def test_the_step_is_recorded_with_its_time_and_phases(
        captured: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = captured
    (row,) = pq.read_table(next(_profile(out, "MLP_train_step").glob("TrainingStep*.parquet"))).to_pylist()
    assert row["step"] == 2 and row["global_batch"] == 8 and row["ranks"] == 1
    assert row["step_time_ns"] > 0 and row["model_flops"] > 0
    assert row["forward_ns"] > 0 and row["backward_ns"] > 0 and row["optimizer_ns"] > 0
    assert row["forward_ns"] + row["backward_ns"] + row["optimizer_ns"] >= row["step_time_ns"] * 0.1
    summary = open_profile(_profile(out, "MLP_train_step")).table("Summary").to_pylist()[0]
    assert summary["training_step_time"] == pytest.approx(row["step_time_ns"] / 1e9)
    assert summary["training_seq_per_s"] == pytest.approx(8 / (row["step_time_ns"] / 1e9))
    assert 0 < summary["training_mfu_percent"] < 1
    events = pq.read_table(next((out / "system").glob("SystemProfileEvents*.parquet"))).to_pylist()
    steps = [json.loads(e["extra_attributes_json"]) for e in events if e["name"] == "train_step"]
    assert sorted(s["step"] for s in steps if s["layout"].startswith("MLP/")) == [1, 2, 3]
