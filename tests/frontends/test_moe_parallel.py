"""Mixture of experts under tensor parallelism: each expert's gate and up projections are
column-parallel and its down projection row-parallel (NxD's ``ExpertMLPs`` layout), so every rank
holds 1/tp of every expert's weights, and the logits stay torch's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import neuroncore as nc  # noqa: E402


def test_mixtral_experts_are_sharded_over_ranks():
    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(3, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, :3] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    whole = nc.trace(model, {"input_ids": ids, "attention_mask": mask})
    sharded = nc.trace(model, {"input_ids": ids, "attention_mask": mask}, instance="trn1.32xlarge",
                       tp_degree=2)
    torch.testing.assert_close(sharded(input_ids=ids, attention_mask=mask)[0], expected,
                               rtol=1e-4, atol=1e-5)
    graph = sharded.program.graph
    # gate and up: [I/tp, H] per expert on each rank; down: [H, I/tp]
    expert_dots = [op for op in graph.ops if op.opcode == "dot" and "/experts/expert." in op.layer]
    assert {op.shape[-1] for op in expert_dots} == {64}  # intermediate 128 / 2, hidden 64
    reduces = [op.layer for op in graph.ops if op.opcode == "all-reduce" and "/experts/" in op.layer]
    assert len(reduces) == 2 * 4  # one per expert's row-parallel down projection, per layer
    experts_bytes = 2 * 4 * 3 * 64 * 128 * 4  # layers x experts x (gate, up, down) x H x I, fp32
    assert whole.program.weight_bytes() - sharded.program.weight_bytes() >= experts_bytes // 2
