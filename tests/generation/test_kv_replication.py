"""KV heads replicated for tensor-parallel ranks that do not divide them, as transformers-neuronx does
(``GQA.REPLICATED_HEADS``, ``neuroncore.parallel.heads``): greedy tokens still equal transformers'."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuroncore.generation import GenerationError, NeuronCausalLM  # noqa: E402
from neuroncore.parallel.heads import head_counts, head_layout  # noqa: E402

T = transformers


def test_the_rule_is_transformers_neuronx_get_qkv_padding():
    assert head_counts(32, 8, 24) == (48, 24, 3)  # Llama-3-8B / Mistral-7B on inf2.48xlarge
    assert head_counts(32, 8, 32) == (32, 32, 4)  # ... on trn1.32xlarge
    assert head_counts(64, 8, 24) == (72, 24, 3)  # Llama-2-70B / Llama-3-70B
    assert head_counts(72, 24, 32) == (96, 32, 1)  # a rank's queries are one KV group: 8 zero KV heads
    assert head_counts(6, 2, 3) == (6, 6, 3)  # no partial copy fits: every query its own KV head
    assert head_counts(32, 32, 24) == (48, 48, 1)  # MHA: padded alike
    assert head_counts(8, 2, 2) == (8, 2, 1)  # tp divides the KV heads: as they are
    layout = head_layout(6, 2, 4)  # 8 query slots, KV heads 0 0 1 1, 2 queries per copy
    assert layout.kv_source == (0, 0, 1, 1)
    assert layout.q_source == (0, 1, 2, -1, 3, 4, 5, -1)
    assert layout.replicated and not head_layout(8, 2, 2).replicated


@pytest.fixture(scope="module")
def gqa():
    """6 query heads over 2 KV heads: tp 4 both pads the queries and copies the KV heads."""
    torch.manual_seed(0)
    config = T.LlamaConfig(hidden_size=96, intermediate_size=128, num_hidden_layers=1, num_attention_heads=6,
                           num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64)
    return T.LlamaForCausalLM(config).eval()


def test_tp_that_does_not_divide_the_kv_heads_generates_transformers_tokens(gqa):
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.int64)
    mask[1, :2] = 0
    ids[1, :2] = 0
    gen = NeuronCausalLM(gqa, n_positions=16, context_length_estimate=8, batch_size=2,
                         instance="trn1.32xlarge", tp_degree=4)
    assert gen.head_layout == head_layout(6, 2, 4)
    out = gen.generate(ids, mask, max_new_tokens=8, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        want = gqa.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                            eos_token_id=None)
    assert torch.equal(out, want)
    # each rank's core holds one KV head: ranks 0 and 1 a copy of head 0, ranks 2 and 3 of head 1
    caches = [gen.cache_values(0, "k", core_rank=r) for r in range(4)]
    assert all(c.shape == (2, 1, 16, 16) for c in caches)
    np.testing.assert_array_equal(caches[0], caches[1])
    np.testing.assert_array_equal(caches[2], caches[3])
    assert not np.array_equal(caches[0], caches[2])
    # the model itself is untouched: the copy that was traced shares its other weights
    assert gqa.model.layers[0].self_attn.k_proj.out_features == 2 * 16
    assert gen._source.model.layers[0].mlp.up_proj.weight is gqa.model.layers[0].mlp.up_proj.weight


def test_a_fused_attention_projection_is_refused_in_one_line():
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(GenerationError, match="tp_degree 4 does not divide its 2 attention / 2 KV heads"):
        NeuronCausalLM(model, n_positions=16, tp_degree=4)
