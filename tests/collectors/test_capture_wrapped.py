"""``neuron-profile capture -- python script.py`` end to end, with the frameworks a user brings.

One wrapped program traces and runs, in one process: README's MLP in fp32 and in bf16, a
transformers ``LlamaForCausalLM`` built from a tiny config (random weights), the same Llama sharded
over two cores (``tp_degree=2``) and a JAX function, each three times (twice for the larger ones).
The capture runs once (module fixture) and every test reads its output: the wrapped path is what a
user runs, so it is tested through the real ``neuron-profile`` entry point in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("jax")

from formats import open_profile
from formats.dataset import capture_state, find_profiles

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = Path(sys.executable)

SCRIPT = '''
import jax, jax.numpy as jnp, numpy as np, torch, transformers
import neuroncore as nc

class MLP(torch.nn.Module):                       # README's MLP, smaller
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

torch.manual_seed(0)
model, x = MLP().eval(), torch.randn(32, 64)
fp32 = nc.trace(model, (x,), instance="trn1.2xlarge")
bf16 = nc.trace(model, (x,), instance="trn1.2xlarge", dtype="bf16")
for _ in range(3):
    y32, y16 = fp32(x), bf16(x)
ref = model(x)
assert float((y32 - ref).abs().max()) < 1e-3 and float((y16 - ref).abs().max()) < 0.1

config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                  max_position_embeddings=64, attn_implementation="eager", use_cache=False)
llama = transformers.LlamaForCausalLM(config).eval()
ids, mask = torch.randint(0, 128, (1, 8)), torch.ones(1, 8, dtype=torch.int64)
one = nc.trace(llama, (ids, mask), instance="trn1.2xlarge")
two = nc.trace(llama, (ids, mask), instance="trn1.32xlarge", tp_degree=2)
for _ in range(2):
    a, b = one(ids, mask)[0], two(ids, mask)[0]
want = llama(ids, attention_mask=mask).logits
assert float((a - want).abs().max()) < 1e-2 and float((b - want).abs().max()) < 1e-2

rng = np.random.default_rng(0)
w1 = jnp.asarray(rng.standard_normal((64, 128)) / 8, jnp.float32)
def mlp(v):
    return jax.nn.gelu(v @ w1)
xj = jnp.ones((32, 64))
jm = nc.trace(mlp, (xj,), instance="trn1.2xlarge")
for _ in range(3):
    yj = jm(xj)
assert float(jnp.abs(yj - mlp(xj)).max()) < 1e-3
print("program finished")
'''


ENTRY = VENV_PYTHON.parent / "neuron-profile"  # the console script a user runs


def neuron_profile(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    command = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "explorer.profile_cli"]
    return subprocess.run([*command, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("wrapped")
    script = root / "s.py"
    script.write_text(SCRIPT)
    done = neuron_profile("capture", "-o", str(root / "out"), "--", str(VENV_PYTHON), str(script))
    return root / "out", done


def test_the_wrapped_program_runs_unharmed_and_the_capture_succeeds(captured):
    _, done = captured
    assert done.returncode == 0, done.stderr[-3000:]
    assert "program finished" in done.stdout  # its own checks of the outputs passed, on the core
    assert "Traceback" not in done.stderr and "6 device profile(s)" in done.stdout


def test_one_complete_profile_per_model_and_rank(captured):
    out, _ = captured
    entries, skipped = find_profiles(out / "device")
    assert not skipped and not list((out / "device").rglob("*.incomplete"))
    names = sorted(e.name for e in entries)
    models = {e.partitions["model"] for e in entries}
    assert len(models) == 5, names  # MLP, MLP_2 (bf16), Llama, Llama tp2 and the JAX function
    tp = [e for e in entries if e.partitions["core"] == "1"]
    assert len(tp) == 1  # the tp2 model's second rank
    for entry in entries:
        state = capture_state(entry.path)
        assert not state.incomplete and not state.warm_up and state.execution == 2
        profile = open_profile(entry.path)
        assert profile.complete and profile.num_rows("Instruction") > 0 and profile.has("Summary")
    assert not list(out.rglob(".*partial")) and not list(out.rglob(".*.jsonl"))


def test_instructions_keep_their_frames_and_source_lines(captured):
    """The defect: traced ``parameter`` ops have no frames, so the per-op frame dictionary held a null
    and the writer refused the whole table (the capture recorded nothing); the ops that have frames
    keep them, pointing at the user's script."""
    out, _ = captured
    entry = next(e for e in find_profiles(out / "device")[0] if e.partitions["model"] == "MLP")
    frames = pq.read_table(next(entry.path.glob("Instruction*.parquet")),
                           columns=["stack_frame_ids", "bir_debug_info_source_location"])
    assert frames.column("stack_frame_ids").null_count < frames.num_rows
    located = [v for v in frames.column("bir_debug_info_source_location").to_pylist() if v]
    assert located and any("s.py" in v for v in located)


def test_collectives_reach_both_ranks_and_the_dataset_reads_whole(captured):
    out, _ = captured
    entries = find_profiles(out / "device")[0]
    sharded = next(e.partitions["model"] for e in entries if e.partitions["core"] == "1")
    ranks = [open_profile(e.path) for e in entries if e.partitions["model"] == sharded]
    assert len(ranks) == 2  # the ranks of one model share its name; the one-core Llama has another
    assert sum(p.num_rows("CcOp") > 0 for p in ranks) == 2
    done = neuron_profile("query", str(out / "device"),
                          "SELECT model, count(*) AS n FROM Instruction GROUP BY 1", "--format", "csv")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1 + 5
    view = neuron_profile("view", str(out / "device"), "--output-format", "summary-text")
    assert view.returncode == 0 and "note:" not in view.stderr, view.stderr
