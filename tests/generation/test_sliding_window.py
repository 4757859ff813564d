"""Sliding-window attention shorter than the generation (Mistral's ``sliding_window``, Qwen2's sliding
layers): the programs build the window masks from each token's real slot; greedy tokens equal
transformers' ``generate``, and differ from full attention (the window is really applied)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from neuroncore.generation import NeuronCausalLM  # noqa: E402

T = transformers
NEW = 9  # a 7-token prompt grows to 15 positions in a 16-position cache: the new token's slot is not
# the end of the bucket the step runs, which is where the model itself would count the window from


def _prompt() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, :2] = 0  # left padding: the window counts sequence indices, pads included, as transformers
    ids[1, :2] = 0
    return ids, mask


def _generate(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                              eos_token_id=None)


def _full_attention(model):
    full = copy.deepcopy(model)
    full.config.sliding_window = None
    if getattr(full.config, "layer_types", None):
        full.config.layer_types = ["full_attention"] * len(full.config.layer_types)
        for layer in full.model.layers:
            layer.self_attn.sliding_window = None
        full.model.has_sliding_layers = False
    return full


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_a_window_shorter_than_the_generation_gives_transformers_tokens(family):
    torch.manual_seed(0)
    dims = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=128, sliding_window=4, max_position_embeddings=64)
    if family == "mistral":
        model = T.MistralForCausalLM(T.MistralConfig(num_hidden_layers=1, **dims)).eval()
    else:  # layer 0 full attention, layer 1 a window (max_window_layers): one mask per layer type
        model = T.Qwen2ForCausalLM(T.Qwen2Config(num_hidden_layers=2, use_sliding_window=True,
                                                 max_window_layers=1, **dims)).eval()
        assert model.config.layer_types == ["full_attention", "sliding_attention"]
    ids, mask = _prompt()
    gen = NeuronCausalLM(model, n_positions=16, context_length_estimate=8, batch_size=2,
                         instance="trn1.2xlarge")
    out = gen.generate(ids, mask, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    want = _generate(model, ids, mask)
    assert torch.equal(out, want)
    assert not torch.equal(want, _generate(_full_attention(model), ids, mask))  # the window mattered
    # the cache keeps every position (a mask, not a rolling cache of the window)
    assert gen.cache_values(0, "k").shape[2] == 16


def test_a_rolling_cache_of_the_window_generates_past_its_length():
    """``rolling_cache=True``: the cache holds the window's 4 positions (slot = position % 4), the
    prompt's last 4 are laid into it on the device, each step attends over the 4 slots still inside
    the window: transformers' tokens, 18 positions through a 4-position cache."""
    from neuroncore.generation import GenerationError

    torch.manual_seed(0)
    model = T.MistralForCausalLM(T.MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, sliding_window=4, max_position_embeddings=64)).eval()
    ids, mask = _prompt()
    gen = NeuronCausalLM(model, n_positions=16, context_length_estimate=8, batch_size=2,
                         instance="trn1.2xlarge", rolling_cache=True)
    assert gen.n_positions == (4,)  # token buckets stop at the window
    out = gen.generate(ids, mask, max_new_tokens=12, eos_token_id=[], pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    assert torch.equal(out, want)
    assert gen.cache_values(0, "k").shape == (2, 2, 4, 16)
    assert gen.last_timing.buckets == [8] + [4] * 11
    assert all(s.host_to_device_bytes == 4 * (2 + 2 + 2 * 5 + 1) for s in gen.last_timing.token_steps)
    qwen = T.Qwen2ForCausalLM(T.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                            use_sliding_window=True, sliding_window=4, max_window_layers=1))
    with pytest.raises(GenerationError, match="rolling_cache needs one sliding window for every layer"):
        NeuronCausalLM(qwen, n_positions=16, rolling_cache=True)
