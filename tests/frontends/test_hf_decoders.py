"""Hugging Face causal LMs and encoders with DEFAULT settings: the default (sdpa) attention, the
default ``use_cache=True`` (a ``DynamicCache`` in the outputs), called as users call them
(``model(input_ids=..., attention_mask=...)``), from tiny configs with random weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_compare import compare  # noqa: E402

SEQ = 8
T = transformers


def _inputs(batch: int = 2, seq: int = SEQ, vocab: int = 128, left_pad: bool = True) -> dict:
    torch.manual_seed(0)
    ids = torch.randint(3, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if left_pad:
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _decoder_configs() -> dict:
    gqa = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return {
        "llama2": (T.LlamaForCausalLM, T.LlamaConfig(**{**gqa, "num_key_value_heads": 4})),
        "llama3": (T.LlamaForCausalLM, T.LlamaConfig(**gqa, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32})),
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**gqa, sliding_window=4)),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**gqa)),
        "gpt2": (T.GPT2LMHeadModel, T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128,
                                                 n_positions=64, bos_token_id=1, eos_token_id=2)),
        "gpt_neo": (T.GPTNeoForCausalLM, T.GPTNeoConfig(
            hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
            window_size=4, vocab_size=128, max_position_embeddings=64, bos_token_id=1,
            eos_token_id=2)),
        "gptj": (T.GPTJForCausalLM, T.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                 vocab_size=128, n_positions=64, bos_token_id=1,
                                                 eos_token_id=2)),
        "opt": (T.OPTForCausalLM, T.OPTConfig(hidden_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, ffn_dim=128, vocab_size=128,
                                              word_embed_proj_dim=64, max_position_embeddings=64,
                                              bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    }


@pytest.mark.parametrize("family", list(_decoder_configs()))
def test_causal_lm_defaults(family):
    cls, config = _decoder_configs()[family]
    assert config.use_cache and getattr(config, "_attn_implementation", None) in (None, "sdpa")
    torch.manual_seed(0)
    model = cls(config).eval()
    # transformers' own default: sdpa, except for families it has no sdpa path for
    # GPT-Neo/GPT-J: transformers' own default differs across its releases (eager, or sdpa in newer ones)
    expected = ("eager", "sdpa") if family in ("gpt_neo", "gptj") else ("sdpa",)
    assert model.config._attn_implementation in expected
    traced, _errors = compare(model, _inputs())
    out = traced(**_inputs())
    layers = config.num_hidden_layers
    # the logits, then the DynamicCache: every layer's keys, then every layer's values
    assert len(out) == 1 + 2 * layers and out[0].shape == (2, SEQ, 128)
    # [batch, kv heads, cached positions, head dim]; Mistral's sliding window keeps its last 4
    assert all(t.dim() == 4 and t.shape[0] == 2 and t.shape[2] <= SEQ for t in out[1:])
    assert not [op for op in traced.graph.ops if op.opcode.startswith("aten.")]


ENCODERS = {
    "bert": lambda: T.BertModel(T.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=128, vocab_size=128)),
    "roberta": lambda: T.RobertaModel(T.RobertaConfig(hidden_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=128,
                                                      vocab_size=128, max_position_embeddings=40)),
    "distilbert": lambda: T.DistilBertModel(T.DistilBertConfig(dim=64, n_layers=2, n_heads=4,
                                                               hidden_dim=128, vocab_size=128)),
}


@pytest.mark.parametrize("family", list(ENCODERS))
def test_encoder_defaults(family):
    torch.manual_seed(0)
    model = ENCODERS[family]().eval()
    assert model.config._attn_implementation == "sdpa"
    traced, _errors = compare(model, _inputs(left_pad=False))
    assert traced(**_inputs(left_pad=False))[0].shape == (2, SEQ, 64)


def test_positional_call_and_errors():
    """Traced with a dict: called by name or positionally in that order; wrong names are one line."""
    torch.manual_seed(0)
    model = ENCODERS["distilbert"]().eval()
    inputs = _inputs()
    import neuroncore as nc

    traced = nc.trace(model, inputs)
    by_name = traced(**inputs)[0]
    positional = traced(inputs["input_ids"], inputs["attention_mask"])[0]
    torch.testing.assert_close(by_name, positional)
    with pytest.raises(nc.TraceError, match="missing input: attention_mask"):
        traced(input_ids=inputs["input_ids"])
    with pytest.raises(nc.TraceError, match="'labels' was not traced"):
        traced(**inputs, labels=inputs["input_ids"])


def test_mixtral_all_experts_with_experts_in_the_hierarchy():
    """Mixtral (4 experts, top-2) with defaults: compiled as NxD Inference's forward_all_experts,
    every expert a layer of its own; the model is left as it was (no expert views, its own
    experts implementation) after tracing."""
    torch.manual_seed(0)
    config = T.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                             num_local_experts=4, num_experts_per_tok=2,
                             max_position_embeddings=64)
    model = T.MixtralForCausalLM(config).eval()
    implementation = model.config._experts_implementation
    traced, _errors = compare(model, _inputs())
    assert model.config._experts_implementation == implementation
    assert not any(name.endswith(".expert") for name, _ in model.named_modules())
    layers = {op.layer for op in traced.graph.ops if op.opcode == "dot"}
    for e in range(4):
        assert f"model/model/layers.1/mlp/experts/expert.{e}" in layers
    assert "model/model/layers.0/mlp/gate" in layers  # the router
