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
