"""``neuron-profile capture -- python script.py`` around a generation, through the real entry point:
every step is one execution the system profile shows, and each program (the prompt's and each
bucket's token step) gets its device profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from formats import open_profile
from formats.dataset import find_profiles

REPO = Path(__file__).resolve().parents[2]

SCRIPT = '''
import torch, transformers
from neuroncore.generation import NeuronCausalLM

torch.manual_seed(0)
config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
llama = transformers.LlamaForCausalLM(config).eval()
ids = torch.randint(3, 64, (1, 5))
gen = NeuronCausalLM(llama, n_positions=(8, 16), context_length_estimate=8, batch_size=1)
out = gen.generate(ids, max_new_tokens=8, eos_token_id=[])
want = llama.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
assert torch.equal(out, want), (out, want)
print("steps", len(gen.last_timing.steps), "buckets", gen.last_timing.buckets)
'''


def test_a_generation_under_capture_profiles_every_program_and_shows_every_step(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(SCRIPT)
    entry = Path(sys.executable).parent / "neuron-profile"
    command = [str(entry)] if entry.exists() else [sys.executable, "-m", "explorer.profile_cli"]
    env = {**os.environ, "NEURONSCOPE_LIVE": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([*command, "capture", "-o", str(tmp_path / "out"), "--", sys.executable,
                           str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # the prompt's program, then contexts 6-8 in the 8-position bucket and 9-12 in the 16
    assert "steps 8 buckets [8, 8, 8, 8, 16, 16, 16, 16]" in done.stdout
    events = open_profile(tmp_path / "out/system").table("SystemProfileEvents").to_pylist()
    assert [e["name"] for e in events].count("nrt_execute") == 8  # one execution per step
    entries, skipped = find_profiles(tmp_path / "out/device")
    assert not skipped
    assert sorted(e.partitions["model"] for e in entries) == [
        "LlamaForCausalLM.context_encoding.8", "LlamaForCausalLM.token_generation.16",
        "LlamaForCausalLM.token_generation.8"]
    for entry in entries:  # each program's 2nd execution (the prompt's only one, marked warm-up)
        assert open_profile(entry.path).num_rows("Instruction") > 0
