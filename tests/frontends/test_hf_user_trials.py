"""Families a new user tried with default settings that stopped before this round: encoders whose
relative-position buckets take ``abs`` of an integer tensor (T5, ModernBERT), ALiBi decoders whose
slopes are ``pow(base, arange(heads))`` (BLOOM, MPT: folded at trace time), an encoder-decoder whose
default ``use_cache`` returns an ``EncoderDecoderCache`` (BART), DeepSeek-V3 (MLA, routed experts);
and a refused operand names its op, layer and file:line. Tiny configs, random weights, fp32 (the bf16
rule is test_hf_decoders')."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_compare import compare, leaves  # noqa: E402

T = transformers
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _inputs(batch: int = 2, seq: int = 8, vocab: int = 128) -> dict:
    torch.manual_seed(0)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, -3:] = 0
    return {"input_ids": torch.randint(3, vocab, (batch, seq)), "attention_mask": mask}


MODELS = {
    "t5-encoder": lambda: T.T5EncoderModel(T.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4,
                                                      d_kv=16, vocab_size=128, **TOKENS)),
    "modernbert": lambda: T.ModernBertModel(T.ModernBertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
        cls_token_id=1, sep_token_id=2, **TOKENS)),
    "bloom": lambda: T.BloomForCausalLM(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=128,
                                                      **TOKENS)),
    "mpt": lambda: T.MptForCausalLM(T.MptConfig(d_model=64, n_layers=2, n_heads=4, vocab_size=128,
                                                max_seq_len=64, **TOKENS)),
    # MLA attention (low-rank q and kv), a dense first layer then sigmoid-scored top-k MoE routing
    # whose gathered weights are normalised by their row sum
    "deepseek-v3": lambda: T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, **TOKENS)),
    # longrope caches long_inv_freq on the model on first use: an export left a fake one there, and
    # the next export of the same model (check, then trace) stopped as 'weights on the meta device'
    "phi3-longrope": lambda: T.Phi3ForCausalLM(T.Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
        original_max_position_embeddings=64,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}, **TOKENS)),
    # dynamic NTK RoPE: transformers recomputes inv_freq when max(position_ids) + 1 passes
    # max_position_embeddings (8 tokens here, 4 positions): a branch on a tensor, refused by export
    "llama-dynamic-rope": lambda: T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=4,
        rope_scaling={"rope_type": "dynamic", "factor": 4.0}, **TOKENS)),
    "bart": lambda: T.BartModel(T.BartConfig(
        d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128, max_position_embeddings=64, **TOKENS)),
    # span-based dynamic convolution through F.unfold (im2col; session 11: aten.index at
    # modeling_convbert.py:209, one per layer)
    "convbert": lambda: T.ConvBertModel(T.ConvBertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
        max_position_embeddings=64, **TOKENS)),
}


@pytest.mark.parametrize("family", list(MODELS))
def test_default_settings_trace_and_match(family: str) -> None:
    import neuroncore as nc

    torch.manual_seed(0)
    model = MODELS[family]().eval()
    assert nc.check(model, _inputs()) == []  # as a user checks first: the model is left as it was
    _, errors = compare(model, _inputs(), bf16=False)
    assert errors["fp32"] < 1e-4


def test_albert_shares_one_layer_bias_between_grouped_dots() -> None:
    """ALBERT calls one layer's weights for every layer. Its attention output is not contiguous, so
    its dense layer is a batched dot, which opens a fusion group; the bias it shares with the next
    layer was lowered while that group was open, and the dot then claimed the bias add as its
    epilogue while the group lowered the add too (KeyError in the compiler, at 12 tokens)."""
    torch.manual_seed(0)
    model = T.AlbertModel(T.AlbertConfig(embedding_size=32, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                         **TOKENS)).eval()
    _, errors = compare(model, _inputs(seq=12), bf16=False)
    assert errors["fp32"] < 1e-4


def test_albert_under_tensor_parallelism_stores_each_layout_of_a_shared_weight_apart() -> None:
    """ALBERT's one layer, read by every layer, is split differently where its input differs (the
    first layer's query weight column-parallel, ...): each layout a weight of its own. Before, the
    layouts shared the HBM tensor of the weight's label and a rank read a 64-wide bias as 32 wide
    (ExecutionError in the runtime), or, where the shapes agreed, another layout's values."""
    import neuroncore as nc

    torch.manual_seed(0)
    model = T.AlbertModel(T.AlbertConfig(embedding_size=32, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                                         **TOKENS)).eval()
    inputs = _inputs()
    traced = nc.trace(model, inputs, instance="trn1.32xlarge", tp_degree=2)
    want = model(**inputs).last_hidden_state
    torch.testing.assert_close(traced(**inputs)[0], want, rtol=1e-4, atol=1e-5)


def _randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Random weights and batch-norm statistics for a conv net whose transformers init makes its
    outputs vanish (MobileNetV2's: 1e-26; EfficientNet's: exactly 0), so a comparison tests
    something."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise / p[0].numel() ** 0.5 if p.dim() > 1
                    else 1 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model


AUDIO_VISION = {
    # Swin's pooler is AdaptiveAvgPool1d, whose core-ATen form ends in a contiguous as_strided
    "swin": (lambda: T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                              num_heads=[2, 4], window_size=4)),
             lambda: {"pixel_values": torch.randn(1, 3, 32, 32)}),
    # interpolate_pos_encoding: its position embeddings resized bicubically to a 48x48 image's grid
    "vit-interpolate-pos-encoding": (lambda: T.ViTModel(T.ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4)),
        lambda: {"pixel_values": torch.randn(1, 3, 48, 48), "interpolate_pos_encoding": True}),
    # wav2vec2's positional convolution is weight-normalised: linalg_vector_norm of its weight
    "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, conv_dim=(32, 32),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4)),
        lambda: {"input_values": torch.randn(1, 800)}),
    # a padded batch with its attention_mask (the stable-layer-norm variant that takes one, as
    # wav2vec2-large-lv60): the feature mask is built with index_put at (arange, lengths - 1), a
    # flipped cumsum and hidden[~mask] = 0, three unsupported ops before
    "wav2vec2-ctc-padded": (lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, conv_dim=(32, 32),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, vocab_size=32, feat_extract_norm="layer",
        do_stable_layer_norm=True)),
        lambda: {"input_values": torch.randn(2, 800),
                 "attention_mask": (torch.arange(800) < torch.tensor([[800], [500]])).long()}),
    # its repeated inverted-residual blocks start with layers that emit no instruction (views only):
    # relocating a template of no nodes divided by zero (compiler/layer_replay)
    "mobilenet-v2": (lambda: _randomized(T.MobileNetV2ForImageClassification(T.MobileNetV2Config(
        image_size=32, depth_multiplier=0.25, num_labels=10))),
        lambda: {"pixel_values": torch.randn(1, 3, 32, 32)}),
    # depthwise convs, SiLU, squeeze-and-excitation; its pooler is AvgPool2d(hidden_dim,
    # ceil_mode=True) over the last map, listed as unsupported before (hidden_dim set to the
    # width-scaled top conv's channels, which transformers' config does not do itself)
    "efficientnet": (lambda: _randomized(T.EfficientNetForImageClassification(T.EfficientNetConfig(
        image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=10))),
        lambda: {"pixel_values": torch.randn(2, 3, 32, 32)}),
}


@pytest.mark.parametrize("family", list(AUDIO_VISION))
def test_audio_and_vision_defaults_trace_and_match(family: str) -> None:
    torch.manual_seed(0)
    build, inputs = AUDIO_VISION[family]
    _, errors = compare(build().eval(), inputs(), rtol=2e-4, atol=5e-5, bf16=False)
    assert errors["fp32"] < 1e-3 and errors["scale"] > 1e-2


class _Strided(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        same = torch.as_strided(x + 1, (4, 2, 8), (16, 8, 1))  # contiguous again: a reshape
        overlapping = torch.as_strided(x + 1, (7, 4), (2, 1))  # windows that share elements
        return same, overlapping


def test_only_contiguous_as_strided_is_a_reshape_and_norms_are_two_norms() -> None:
    import neuroncore as nc

    (missing,) = nc.check(_Strided(), (torch.randn(4, 16),))
    assert missing.opcode == "aten.as_strided"
    x = torch.randn(6, 16)

    class Norm(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.linalg.vector_norm(x, dim=1, keepdim=True), torch.nn.functional.normalize(x, dim=0)

    ours = nc.trace(Norm(), (x,))(x)
    for got, want in zip(ours, Norm()(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert nc.check(Norm(), (x,)) == []

    class L1(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.linalg.vector_norm(x, ord=1)

    (missing,) = nc.check(L1(), (x,))
    assert missing.opcode == "aten.linalg_vector_norm"


def test_bart_outputs_its_encoder_decoder_cache() -> None:
    """The cache comes back flattened (self-attention keys/values, then cross-attention), equal to
    transformers' own."""
    import neuroncore as nc

    torch.manual_seed(0)
    model = MODELS["bart"]().eval()
    inputs = _inputs()
    out = model(**inputs)
    assert isinstance(out.past_key_values, T.cache_utils.EncoderDecoderCache)
    ours = nc.trace(model, inputs)(**inputs)
    assert len(ours) == 2 + 4  # last hidden state, 1 layer x (self k, v + cross k, v), encoder state
    torch.testing.assert_close(ours[-1], out.encoder_last_hidden_state, rtol=1e-4, atol=1e-5)


class _Buckets(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rel = torch.arange(8)[None, :] - torch.arange(8)[:, None]
        return x + torch.abs(rel).to(x.dtype)


def test_integer_abs_and_a_refused_operand_names_op_layer_and_line(monkeypatch) -> None:
    import neuroncore as nc
    from neuroncore.ir.builder import GraphBuilder, GraphError

    x = torch.randn(8, 8)
    torch.testing.assert_close(nc.trace(_Buckets(), (x,))(x), _Buckets()(x))

    def refuse(self, *args, **kwargs):
        raise GraphError("maximum: operands refused")

    monkeypatch.setattr(GraphBuilder, "maximum", refuse)
    with pytest.raises(nc.TraceError) as error:
        nc.trace(_Buckets(), (x,))
    message = str(error.value)
    assert "\n" not in message and "aten.abs" in message and "operands refused" in message
    assert f"{__file__.rsplit('/', 1)[-1]}:" in message and " at " in message


class _Spectrum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(self.lin(x)).abs()


def test_an_op_with_a_complex_result_is_listed_not_a_dtype_error() -> None:
    """``check`` lists the op that makes a complex tensor (the core has none) with its layer and
    line, instead of stopping on the dtype before the coverage table."""
    import neuroncore as nc

    (missing,) = nc.check(_Spectrum().eval(), (torch.randn(4, 16),))
    assert missing.opcode == "aten._fft_r2c" and missing.layer == "model"
    assert missing.source.startswith(__file__) or __file__.rsplit("/", 1)[-1] in missing.source


class _ComplexRotary(torch.nn.Module):
    """Llama 4's rotary embedding: ``torch.polar`` frequencies, scaled, multiplied as complex numbers."""

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        freqs = torch.polar(torch.ones_like(angles), angles) * 1.0
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs).flatten(-2)


def test_ops_making_complex_values_are_listed_even_with_a_handler() -> None:
    """A complex product has a handler for real tensors (``aten.mul``); it is listed as unsupported
    with its layer and line, like ``torch.polar`` before it, not a dtype error that stops ``check``."""
    import neuroncore as nc

    missing = nc.check(_ComplexRotary().eval(), (torch.randn(2, 8, 16), torch.randn(2, 8, 8)))
    assert {m.opcode for m in missing} == {"aten.polar", "aten.mul", "aten.view_as_complex",
                                           "aten.view_as_real"}
    assert all(m.layer == "model" and __file__.rsplit("/", 1)[-1] in m.source for m in missing)


def test_a_real_vocabulary_of_logits_is_stored_in_column_chunks() -> None:
    """GPT-2's own 50,257-token vocabulary (its default config, hidden size cut): the logits are FP32
    rows of 201 KiB per partition, wider than SBUF, so they live in HBM, and the graph output (a
    reshape of the lm_head's dot) was loaded whole to be stored: 'cannot place dot.N.t0'. Any
    single-core LM with a 50k-128k vocabulary (GPT-2, Llama 3) stopped there."""
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=1, n_head=2)).eval()
    inputs = {"input_ids": torch.randint(0, model.config.vocab_size, (1, 4)),
              "attention_mask": torch.ones(1, 4, dtype=torch.int64)}
    _, errors = compare(model, inputs, bf16=False)
    assert errors["fp32"] < 1e-4


def test_mamba_traces_without_its_cache_and_says_so_with_it() -> None:
    """Mamba's time step is ``softplus`` = ``log1p(exp(x))``: ``aten.log1p`` was its one unsupported
    op. With ``use_cache=False`` its reference selective scan (a loop over positions, unrolled at
    export) matches transformers; with the default cache, one line says what to change (it was
    torch's pytree message about DynamicLayer)."""
    import neuroncore as nc

    config = dict(hidden_size=32, num_hidden_layers=1, vocab_size=128, state_size=4, expand=2)
    torch.manual_seed(0)
    model = T.MambaForCausalLM(T.MambaConfig(use_cache=False, **config)).eval()
    inputs = {"input_ids": torch.randint(0, 128, (2, 6))}
    _, errors = compare(model, inputs, bf16=False)
    assert errors["fp32"] < 1e-4
    x = torch.linspace(-9.0, 9.0, 64).reshape(4, 16)

    class Exact(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.log1p(x.abs()), torch.expm1(x)

    for got, want in zip(nc.trace(Exact(), (x,))(x), Exact()(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(nc.TraceError, match="use_cache=False") as error:
        nc.trace(T.MambaForCausalLM(T.MambaConfig(**config)).eval(), inputs)
    assert "\n" not in str(error.value)


def test_a_manual_decode_loop_passes_the_cache_back_in() -> None:
    """A user's own decode loop: prefill, then the next token with the returned cache passed back
    (``model(next_ids, attention_mask=..., cache=out.cache)``). The exported program rebuilds the
    cache's layers, whose ``torch.tensor([])`` placeholders ``run_decompositions`` lifted anew and
    then dropped: 'torch.export failed: Constant tensor lifted_tensor_4 is not in the constants
    dictionary'. Each step has its own cache length, so its own program (static shapes)."""
    import copy

    import neuroncore as nc

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, **TOKENS)).eval()
    prompt = _inputs()
    with torch.no_grad():
        out = model(**prompt)
    cache = out.cache
    step = {"input_ids": out.logits[:, -1].argmax(-1, keepdim=True),
            "attention_mask": torch.cat([prompt["attention_mask"], torch.ones(2, 1, dtype=torch.int64)], 1),
            "cache": cache}
    traced = nc.trace(model, step)
    got = traced(**step)
    with torch.no_grad():
        want = model(**{**step, "cache": copy.deepcopy(cache)})
    assert len(got) == 1 + 2 * 2 and got[1].shape == (2, 2, 9, 16)  # logits, then the grown cache
    layers = want.cache.layers
    expected = [want.logits, *[layer.keys for layer in layers], *[layer.values for layer in layers]]
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_a_head_whose_labels_tp_does_not_divide_stays_whole_on_every_rank() -> None:
    """Swin with 3 labels at tp 2: its classifier reads the (replicated) pooled features, so the
    sharder made it column-parallel and refused 3 output features ('tp_degree 2 does not divide the
    3 output features'). A head, whose result no other matmul reads, is kept whole on every rank, as
    NxD keeps a plain nn.Linear; a hidden layer of such a size is still refused
    (tests/neuroncore/test_parallel.py)."""
    import neuroncore as nc

    torch.manual_seed(0)
    model = T.SwinForImageClassification(T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
        num_labels=3)).eval()
    pixels = torch.randn(2, 3, 32, 32)
    traced = nc.trace(model, {"pixel_values": pixels}, instance="trn1.32xlarge", tp_degree=2)
    with torch.no_grad():
        want = model(pixel_values=pixels).logits
    torch.testing.assert_close(traced(pixel_values=pixels)[0], want, rtol=1e-4, atol=1e-5)


def test_fewer_kv_heads_than_ranks_are_computed_whole_on_every_rank() -> None:
    """Llama with 2 KV heads at tp 4 was refused ('tp_degree 4 does not divide the 2 heads');
    NxD replicates KV heads when the ranks outnumber them. The k/v projections are now computed
    whole on every rank (each rank then reads its query heads' KV head), with no collective of
    their own: the program's all-reduces are the ones tp 2 has (o_proj, down_proj per layer, the
    embedding)."""
    import neuroncore as nc
    from neuroncore.parallel import shard

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, **TOKENS)).eval()
    inputs = _inputs()
    traced = nc.trace(model, inputs, instance="trn1.32xlarge", tp_degree=4)
    with torch.no_grad():
        want = leaves(model(**inputs))
    got = traced(**inputs)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    collectives = {tp: [op.opcode for op in shard(traced.graph, tp).collectives] for tp in (2, 4)}
    assert collectives[4] == collectives[2] and set(collectives[4]) == {"all-reduce"}
    with pytest.raises(nc.TraceError, match="does not divide the 4 heads"):  # query heads: still refused
        nc.trace(model, inputs, instance="trn1.32xlarge", tp_degree=8)
