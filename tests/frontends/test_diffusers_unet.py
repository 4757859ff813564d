"""Stable Diffusion's UNet (diffusers ``UNet2DConditionModel``) with its default settings, from a
small config with random weights: convolutions, group norm, SiLU, sinusoidal timestep embeddings,
self- and cross-attention (sdpa), nearest upsampling and the skip concatenations of the up path,
called as pipelines call it (``unet(latents, timestep, encoder_hidden_states)``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from hf_compare import compare  # noqa: E402


def _small_unet() -> torch.nn.Module:
    """SD 1.5's block layout (cross-attention down/up blocks around plain ones, a cross-attention
    mid block) at 32/64 channels, 8 groups, 8-wide heads, one layer per block."""
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=8).eval()


def test_sd_unet_defaults_match_torch():
    model = _small_unet()
    torch.manual_seed(1)
    latents, timesteps, text = torch.randn(2, 4, 8, 8), torch.tensor([10, 500]), torch.randn(2, 5, 32)
    traced, errors = compare(model, (latents, timesteps, text), rtol=2e-4, atol=5e-5)
    assert errors["bf16"] <= 2 * errors["torch_bf16"]
    ops = traced.graph.ops
    assert not [op for op in ops if op.opcode.startswith("aten.")]
    layers = {op.layer for op in ops if op.opcode == "dot"}
    # cross-attention reads the text states: its key projection is a layer of its own
    assert "model/down_blocks.0/attentions.0/transformer_blocks.0/attn2/to_k" in layers
    assert "model/mid_block/attentions.0/transformer_blocks.0/attn2/to_v" in layers
    assert "model/up_blocks.0/upsamplers.0/conv" in {op.layer for op in ops
                                                      if op.opcode == "convolution"}
    assert "model/time_embedding/linear_1" in layers
    norms = {op.layer for op in ops if op.opcode == "rsqrt"}
    assert "model/down_blocks.0/resnets.0/norm1" in norms  # group norm


def test_flux_transformer_with_its_float64_rotary_embedding_matches_torch():
    """diffusers' ``FluxTransformer2DModel`` (small config, default settings) computes its rotary
    embedding in float64 (``get_1d_rotary_pos_embed(..., freqs_dtype=torch.float64)``): it runs in
    FP32 as on Neuron, which has no FP64 datapath (before: 'float64 tensors are not supported'),
    within fp32 tolerance of torch and, with ``dtype="bf16"``, within 2x torch's own bf16 error."""
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
    torch.manual_seed(1)
    img_ids = torch.zeros(16, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(16) // 4, torch.arange(16) % 4  # a 4x4 latent grid
    inputs = dict(hidden_states=torch.randn(1, 16, 4), encoder_hidden_states=torch.randn(1, 8, 32),
                  pooled_projections=torch.randn(1, 32), timestep=torch.tensor([0.5]), img_ids=img_ids,
                  txt_ids=torch.zeros(8, 3))
    traced, errors = compare(model, inputs, rtol=2e-4, atol=5e-5)
    assert errors["bf16"] <= 2 * errors["torch_bf16"]
    assert not [op for op in traced.graph.ops if op.opcode.startswith("aten.")]
