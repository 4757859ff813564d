"""The PyTorch frontend: ATen op coverage, layer paths and frames, inputs/outputs, errors, buckets.

Every traced module is executed on the core and compared with the module's own output. Models are
tiny so the file stays fast; the transformer models are in ``test_torch_models.py``.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import neuroncore as nc  # noqa: E402
from neuroncore.compiler import UnsupportedOpsError  # noqa: E402
from neuroncore.frontends import TraceError  # noqa: E402
from neuroncore.frontends import torch_frontend as tf  # noqa: E402

THIS_FILE = os.path.abspath(__file__)
RTOL, ATOL = 1e-4, 1e-5


def _line(marker: str) -> int:
    """The line of this file that contains ``marker`` (to check frames without hard-coding)."""
    with open(THIS_FILE) as f:
        for number, text in enumerate(f, 1):
            if marker in text and "_line(" not in text:
                return number
    raise AssertionError(marker)


def reference(module, inputs):
    with torch.no_grad():
        return module(*inputs)


def assert_matches(actual, expected, rtol=RTOL, atol=ATOL):
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_matches(a, e, rtol, atol)
        return
    assert isinstance(actual, torch.Tensor)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if expected.dtype == torch.bool or not expected.is_floating_point():
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


class Fn(nn.Module):
    """A module around a function of tensors (each op case below is one)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g)


X = randn(2, 6, 16)
P = torch.rand(2, 6, 16, generator=torch.Generator().manual_seed(5)) + 0.1  # positive
IDS = torch.tensor([[1, 5, 0, 7, 3, 3]], dtype=torch.int64)

# name -> (function, inputs): each is exported, decomposed to core ATen, traced and compared
OP_CASES = {
    "add_sub_mul_div": (lambda a, b: (a + b * 2 - 1.5) / (b.abs() + 1), (X, randn(6, 16, seed=1))),
    "add_alpha_rsub": (lambda a, b: torch.add(a, b, alpha=0.5) + torch.rsub(a, 3.0), (X, X)),
    "neg_exp_tanh_sigmoid": (lambda a: -torch.exp(a) + torch.tanh(a) * torch.sigmoid(a), (X,)),
    "rsqrt_sqrt_log": (lambda p: torch.rsqrt(p) + torch.sqrt(p) - torch.log(p), (P,)),
    "pow_2_3_half": (lambda a, p: a.pow(2) + a.pow(3) - p.pow(0.5) + p ** -0.5, (X, P)),
    "reciprocal": (lambda p: torch.reciprocal(p) + 1 / p, (P,)),
    "cos_sin": (lambda a: torch.cos(a * 3) * torch.sin(a * 2), (X,)),
    "relu_max_min": (lambda a, b: F.relu(a) + torch.maximum(a, b) - torch.minimum(a, b),
                     (X, randn(2, 6, 16, seed=2))),
    "clamp_hardtanh": (lambda a: a.clamp(-0.5, 0.7) + F.hardtanh(a) + a.clamp(min=0.1), (X,)),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), (X,)),
    "gelu_exact": (lambda a: F.gelu(a), (X,)),
    "silu": (lambda a: F.silu(a), (X,)),
    "where_masked_fill": (lambda a, b: torch.where(a > b, a, b * 0.5).masked_fill(a < -1, -3.0),
                          (X, randn(2, 6, 16, seed=3))),
    "compare_all": (lambda a, b: torch.stack([a < b, a <= b, a > b, a >= b, a == a, a != b]).float(),
                    (X, randn(2, 6, 16, seed=4))),
    "logical": (lambda a: ((a > 0) & (a < 1)) | ~(a > -1), (X,)),
    "sum_mean_amax_amin": (lambda a: a.sum(-1) + a.mean(-1) * 2 + a.amax(-1) - a.amin(-1), (X,)),
    "reduce_middle_keepdim": (lambda a: a.sum(1, keepdim=True) * a.mean((0, 1), keepdim=True), (X,)),
    "var_mean": (lambda a: a.var(-1, keepdim=True) + a.mean(-1, keepdim=True), (X,)),
    "softmax_last": (lambda a: torch.softmax(a, -1), (X,)),
    "softmax_middle": (lambda a: torch.softmax(a, 1), (X,)),
    "log_softmax": (lambda a: F.log_softmax(a, -1), (X,)),
    "layer_norm": (lambda a: F.layer_norm(a, (16,), eps=1e-5), (X,)),
    "views": (lambda a: a.reshape(12, 16).t().unsqueeze(0).squeeze(0).transpose(0, 1).contiguous()
              .view(2, 6, 4, 4).permute(0, 2, 1, 3).flatten(2), (X,)),
    "slice_select_cat": (lambda a: torch.cat([a[:, 1:4], a[:, :, None, 0].expand(2, 6, 16)[:, ::2],
                                              a[:, -1:], a.select(1, 2)[:, None]], 1)[..., 3:11:2], (X,)),
    "split_unbind_chunk": (lambda a: sum(a.split([4, 12], -1)[1].unbind(1)) + a.chunk(2, -1)[0].sum(1)
                           .repeat(1, 2)[:, :12], (X,)),
    "matmul_batched": (lambda a, b: a @ b.transpose(-1, -2), (X, randn(2, 5, 16, seed=5))),
    "matmul_broadcast_2d": (lambda a, w: a @ w, (X, randn(16, 8, seed=6))),
    "outer_product": (lambda a, b: a[..., None] @ b[..., None, :], (randn(3, 5), randn(3, 4))),
    "linear_bias": (lambda a, w, b: F.linear(a, w, b), (X, randn(8, 16, seed=7), randn(8, seed=8))),
    "embedding": (lambda ids, w: F.embedding(ids, w) * 2, (IDS, randn(10, 16, seed=9))),
    "index_select": (lambda w, ids: torch.index_select(w, 0, ids[0]), (randn(10, 16, seed=9), IDS)),
    "arange_iota": (lambda a: a + torch.arange(16, dtype=torch.float32) * 0.5
                    + torch.arange(2, 8)[:, None].float(), (X,)),
    "triu_tril_full": (lambda a: a[0, :6, :6] + torch.full((6, 6), -1e4).triu(1)
                       + torch.ones(6, 6).tril(-2) * 3, (X,)),
    "causal_mask_from_iota": (lambda a: torch.softmax(
        (a @ a.transpose(-1, -2)).masked_fill(torch.arange(6)[None, :] > torch.arange(6)[:, None],
                                              float("-inf")), -1), (X,)),
    "int_input_to_float": (lambda ids: ids.float() * 0.5 + (ids > 2).to(torch.float32), (IDS,)),
    "int_output": (lambda ids: ids * 2 + 1, (IDS,)),
    "bool_output": (lambda a: a > 0.2, (X,)),
    "constant_index_mask": (lambda a, m: a[..., :6] + m.bool()[torch.arange(1)[:, None, None],
                                                       torch.arange(6)[None, None, :]].float(),
                            (X, torch.ones(1, 6, dtype=torch.int64))),
    "max_min_forms": (lambda a, b: a.max(-1).values[..., None] + a.min(1, keepdim=True)[0]
                      + torch.max(a, b) + a.max() - torch.min(a), (X, randn(2, 6, 16, seed=6))),
    "var_mean_split": (lambda a: torch.var_mean(a, -1, correction=0)[0][..., None] * a.split(4, -1)[3]
                       + a.clamp_min(0.2).chunk(4, -1)[1], (X,)),
    "stack_xor": (lambda a: torch.stack([a, a * 2], 1).sum(1) + torch.logical_xor(a > 0, a > 1), (X,)),
    "constant_index_strided": (lambda a: a[:, torch.arange(0, 6, 2)] * 2, (X,)),
    "constant_index_nonadjacent": (lambda a: a[torch.arange(2)[:, None], :, torch.arange(1, 5)[None, :]],
                                   (X,)),
    "constant_index_transposed": (lambda a: a[:, torch.arange(3)[None, :], torch.arange(5)[:, None]],
                                  (X,)),
    "runtime_index_gather": (lambda w, ids: w[ids[0]] + 1, (randn(10, 16, seed=9), IDS)),
    "full_like_zeros": (lambda a: a + torch.zeros_like(a) + torch.ones(16) * 2 + torch.full_like(a, 0.25),
                        (X,)),
}


def run_converted(converted, inputs):
    """Compile and execute a Converted program on one trn1 core."""
    program = nc.compile(converted.graph, "trn1")
    model = nc.Instance("trn1.2xlarge").core(0).load(program)
    return converted.from_arrays(model.execute(converted.to_arrays(inputs)).outputs)


@pytest.mark.parametrize("name", sorted(OP_CASES))
def test_op_cases_match_torch(name):
    fn, inputs = OP_CASES[name]
    module = Fn(fn)
    traced = nc.trace(module, inputs)
    assert_matches(traced(*inputs), reference(module, inputs))
    assert not nc.check(module, inputs)
    assert not any(op.opcode.startswith("aten.") for op in traced.graph.ops)


@pytest.mark.parametrize("name", sorted(OP_CASES))
def test_op_cases_without_core_aten_decompositions(name):
    """``from_exported`` also takes the un-decomposed ATen of ``torch.export.export`` (linear,
    matmul, silu, layer_norm, triu, masked_fill, stack ...), e.g. a program from torch.export.load."""
    fn, inputs = OP_CASES[name]
    module = Fn(fn)
    converted = tf.from_exported(torch.export.export(module, inputs), name="Fn")
    assert not nc.compiler.unsupported_ops(converted.graph)
    assert_matches(run_converted(converted, inputs), reference(module, inputs))


def test_pow_with_exponents_known_at_trace_time_has_torchs_values():
    """Any float exponent known at trace time (a number or a constant tensor; dynamic NTK RoPE's
    ``base ** (arange / dim)`` with a computed base) is exp(y * log|x|) with torch's signs: NaN for a
    negative base and a non-integer exponent, the sign for odd ones, 1 for ``x ** 0``, 0 / inf at 0."""

    class Pow(torch.nn.Module):
        def forward(self, x):
            e = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, -1.0, -2.5, 1.5])
            return x ** e, x ** 1.7, x ** -3.0, x.abs() ** 0.3, x ** torch.tensor([1.25, 0.5] * 4)

    x = torch.tensor([[-2.0, -1.5, -0.5, 0.0, 0.7, 3.0, -3.0, 2.0], [0.0] * 8, [1.3] * 8])
    assert nc.check(Pow(), (x,)) == []  # before: aten.pow listed for all but the first output
    for got, want in zip(nc.trace(Pow(), (x,))(x), Pow()(x)):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6, equal_nan=True)


def test_max_values_and_indices_are_both_lowered():
    """(Before session 11 the indices stayed an unsupported ``aten.max``; they are the first index
    of the maximum now: test_torch_masks.test_max_and_min_over_a_dim_give_their_indices_like_torch.)"""
    fn = Fn(lambda a: a.max(-1))
    assert nc.check(fn, (X,)) == []
    for got, want in zip(nc.trace(fn, (X,))(X), fn(X)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_diagonal_constant_index_is_unsupported():
    missing = nc.check(Fn(lambda a: a[:, torch.arange(6), torch.arange(6)]), (X[..., :6],))
    assert [(op.opcode, op.shape) for op in missing] == [("aten.index", (2, 6))]


def test_transposed_weight_is_read_through_the_dot():
    """``x @ W.T`` of an nn.Linear is one dot with rhs_contract=-1, no transpose op."""
    module = nn.Linear(16, 8)
    traced = nc.trace(module, (X,))
    ops = traced.graph.ops
    assert not any(op.opcode == "transpose" for op in ops)
    dot = next(op for op in ops if op.opcode == "dot")
    weight = dot.operands[1]
    assert weight.opcode == "constant" and weight.shape == (8, 16)
    assert dot.attrs["rhs_contract"] == 1
    assert weight.attrs["qualified_name"] == "weight" and weight.attrs["label"] == "model/weight"
    assert_matches(traced(X), reference(module, (X,)))


def test_attention_scores_read_keys_transposed_without_a_transpose():
    module = Fn(lambda q, k: torch.softmax(q @ k.transpose(-1, -2) / 4, -1))
    q, k = randn(2, 3, 8, 16), randn(2, 3, 8, 16, seed=1)
    traced = nc.trace(module, (q, k))
    dots = [op for op in traced.graph.ops if op.opcode == "dot"]
    assert len(dots) == 1 and dots[0].attrs["rhs_contract"] == len(dots[0].shape) - 1
    assert not any(op.opcode == "transpose" for op in traced.graph.ops)
    assert_matches(traced(q, k), reference(module, (q, k)))


# -- an MLP, fp32 and bf16 -----------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, d_out=16):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.out = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        h = F.gelu(self.fc1(x))  # MLP-GELU-LINE
        h = F.relu(self.fc2(h))
        return self.out(h)


def test_mlp_fp32():
    torch.manual_seed(0)
    module, x = MLP().eval(), torch.randn(8, 32)
    traced = nc.trace(module, (x,))
    out = traced(x)
    assert_matches(out, reference(module, (x,)))
    assert traced.last_result is not None and traced.last_result.device_time_ns > 0


def test_mlp_bf16_error_is_within_torch_autocast_error():
    torch.manual_seed(0)
    module, x = MLP().eval(), torch.randn(8, 32)
    traced = nc.trace(module, (x,), dtype="bf16")
    exact = reference(module, (x,))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        framework_bf16 = module(x).float()
    ours = traced(x)
    assert ours.dtype == torch.float32
    ours_err = (ours - exact).abs().max().item()
    torch_err = (framework_bf16 - exact).abs().max().item()
    assert 0 < ours_err <= 2 * torch_err, (ours_err, torch_err)
    dots = [op for op in traced.graph.ops if op.opcode == "dot"]
    assert dots and all(d.operands[0].dtype is nc.ir.graph.DType.BF16 for d in dots)


# -- unsupported ops: check and trace ------------------------------------------------------------


class Factor(nn.Module):
    def forward(self, a):
        spd = a @ a.transpose(-1, -2) + torch.eye(a.shape[-1]) * 4
        return torch.linalg.cholesky(spd)  # CHOLESKY-LINE


class WithUnsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.factor = Factor()

    def forward(self, x):
        y = self.factor(self.proj(x))
        return torch.lgamma(y)  # LGAMMA-LINE


def test_check_lists_unsupported_ops_with_layer_and_line():
    x = randn(8, 8)
    missing = nc.check(WithUnsupported(), (x,))
    listing = [(op.opcode, op.layer, op.source) for op in missing]
    assert listing == [
        ("aten.linalg_cholesky_ex", "model/factor", f"{THIS_FILE}:{_line('CHOLESKY-LINE')}"),
        ("aten.lgamma", "model", f"{THIS_FILE}:{_line('LGAMMA-LINE')}"),
    ]
    assert missing[0].shape == (8, 8) and missing[1].shape == (8, 8)
    with pytest.raises(UnsupportedOpsError) as info:
        nc.trace(WithUnsupported(), (x,))
    assert [op.name for op in info.value.ops] == [op.name for op in missing]
    message = str(info.value)
    assert "aten.linalg_cholesky_ex" in message and "model/factor" in message
    assert f"test_torch_frontend.py:{_line('CHOLESKY-LINE')}" in message
    assert f"test_torch_frontend.py:{_line('LGAMMA-LINE')}" in message


# -- layer paths and frames ------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, -1).transpose(1, 2)  # Q-PROJ-LINE
        k = self.k_proj(x).view(b, s, self.heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, -1).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        probs = torch.softmax(scores, dim=-1)  # SOFTMAX-LINE
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, s, d))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        return x + self.self_attn(self.norm(x))  # LAYER-CALL-LINE


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_layer_paths_and_frames_on_instructions():
    torch.manual_seed(0)
    module, x = Stack().eval(), torch.randn(1, 8, 32)
    traced = nc.trace(module, (x,))
    assert_matches(traced(x), reference(module, (x,)))
    program, graph = traced.program, traced.graph
    layers = {graph.ops[i].layer for i in np.unique(program.op_index)}
    for expected in ("model/layers.0/self_attn/q_proj", "model/layers.1/self_attn/o_proj",
                     "model/layers.0/self_attn", "model/layers.1/norm"):
        assert expected in layers, sorted(layers)
    q_dot = next(op for op in graph.ops
                 if op.opcode == "dot" and op.layer == "model/layers.0/self_attn/q_proj")
    nodes = np.flatnonzero(program.op_index == q_dot.index)
    assert any(program.opcodes[program.opcode_id[n]] == "MATMUL" for n in nodes)
    # frames: outermost first, innermost last; torch's own files are left out
    files_lines = [(f.file, f.line) for f in q_dot.frames]
    assert files_lines[-1] == (THIS_FILE, _line("Q-PROJ-LINE"))
    assert (THIS_FILE, _line("LAYER-CALL-LINE")) in files_lines
    assert all(f.function == "forward" for f in q_dot.frames if f.file == THIS_FILE)
    assert not any("torch/nn" in f.file for f in q_dot.frames)
    softmax = next(op for op in graph.ops if op.opcode == "softmax")
    assert softmax.source == f"{THIS_FILE}:{_line('SOFTMAX-LINE')}"
    assert re.fullmatch(r"softmax\.\d+", softmax.name) and re.fullmatch(r"dot\.\d+", q_dot.name)
    weight = q_dot.operands[1]
    assert weight.layer == "model/layers.0/self_attn/q_proj"
    assert weight.attrs["qualified_name"] == "layers.0.self_attn.q_proj.weight"


def test_layer_path_convention():
    stack = {"a": ("", object), "b": ("model.layers.0.self_attn.q_proj", object)}
    assert tf.layer_path(stack) == "model/model/layers.0/self_attn/q_proj"
    assert tf.layer_path({"a": ("layers.12.mlp", object)}) == "model/layers.12/mlp"
    assert tf.layer_path(None) == "model"


# -- inputs, outputs, shapes -----------------------------------------------------------------------


def test_call_with_another_shape_names_compiled_and_given_shapes():
    module = MLP()
    traced = nc.trace(module, (torch.randn(8, 32),))
    with pytest.raises(TraceError, match=r"inputs of shapes \[\(4, 32\)\] given; compiled for "
                                         r"\[\(8, 32\)\]"):
        traced(torch.randn(4, 32))


def test_call_with_wrong_count_or_dtype():
    module = Fn(lambda a, b: a + b)
    traced = nc.trace(module, (X, X))
    with pytest.raises(TraceError, match=r"Fn was traced with 2 tensor inputs \(xs_0, xs_1\); 1 given"):
        traced(X)
    with pytest.raises(TraceError, match=r"dtype float64 given, traced with float32"):
        traced(X, X.double())


def test_output_structures():
    module = Fn(lambda a: {"sum": a.sum(-1), "pair": (a * 2, [a - 1])})
    traced = nc.trace(module, (X,))
    out = traced(X)
    expected = reference(module, (X,))
    assert set(out) == {"sum", "pair"}
    assert_matches(out["sum"], expected["sum"])
    assert_matches(out["pair"][0], expected["pair"][0])
    assert isinstance(out["pair"][1], list)
    assert_matches(out["pair"][1][0], expected["pair"][1][0])


def test_scalar_and_constant_outputs():
    module = Fn(lambda a: (a.sum(), torch.full((), 2.0), torch.zeros(2, 3), torch.arange(4)))
    out = nc.trace(module, (X,))(X)
    assert_matches(list(out), list(reference(module, (X,))), rtol=1e-5, atol=1e-4)


def test_same_tensor_returned_twice_and_an_input_returned():
    module = Fn(lambda a: (a * 2, a * 2, a))
    traced = nc.trace(module, (X,))
    out = traced(X)
    assert len(out) == 3
    assert_matches(out[0], X * 2)
    assert_matches(out[2], X)


class Named(nn.Module):
    def forward(self, ids, a):
        return ids + 1, a.to(torch.bfloat16)


def test_to_arrays_and_from_arrays_convert_dtypes():
    converted = tf.convert(Named(), (IDS, X), autocast=None)
    arrays = converted.to_arrays((IDS, X))
    assert arrays[0].dtype == np.int32 and arrays[1].dtype == np.float32
    params = converted.graph.parameters
    assert [p.name for p in params] == ["ids", "a"]
    assert params[0].dtype is nc.ir.graph.DType.INT32
    out = converted.from_arrays([np.asarray(IDS.numpy() + 1, np.int32), X.numpy()])
    assert out[0].dtype == torch.int64 and out[1].dtype == torch.bfloat16


def test_bf16_model_parameters():
    torch.manual_seed(0)
    module = MLP().to(torch.bfloat16).eval()
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    traced = nc.trace(module, (x,))
    out = traced(x)
    expected = reference(module, (x,))
    assert out.dtype == torch.bfloat16
    assert (out.float() - expected.float()).abs().max().item() <= 0.05 * expected.float().abs().max().item()


def test_resize_pads_and_cuts_inputs_that_share_the_first_length():
    ids, mask, other = torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 5), torch.ones(2, 3)
    padded = tf.resize((ids, mask, other), 1, 8)
    assert [tuple(t.shape) for t in padded] == [(2, 8), (2, 8), (2, 3)]
    assert padded[0].dtype == torch.int64 and padded[1][:, 5:].abs().sum() == 0
    cut = tf.resize((ids, mask, other), 1, 4)
    assert [tuple(t.shape) for t in cut] == [(2, 4), (2, 4), (2, 3)]


# -- errors ------------------------------------------------------------------------------------------


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # BRANCH-LINE
            return x * 2
        return x - 1


class MaskSelect(nn.Module):
    def forward(self, x):
        return x[x > 0] * 2


class NotExportable(nn.Module):
    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2)


def test_data_dependent_control_flow_is_one_clear_error():
    with pytest.raises(TraceError) as info:
        nc.trace(DataDependent(), (X,))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("DataDependent: data-dependent control flow")
    assert f"{THIS_FILE}:{_line('BRANCH-LINE')}" in message


class ItemBranch(nn.Module):
    def forward(self, x):
        y = x * 3
        if (y > 0).any().item():  # ITEM-LINE
            return y * 2
        return x - 1


def test_data_dependent_item_branch_is_one_line_and_prints_nothing(capfd):
    """torch.export prints the partial graph of a failed trace to stderr (twice) and a warning: a
    user saw hundreds of lines before the one-line error (Longformer's global-attention branch)."""
    with pytest.raises(TraceError) as info:
        nc.check(ItemBranch(), (X,))
    message = str(info.value)
    assert "\n" not in message and message.startswith("ItemBranch: data-dependent control flow")
    assert f"{THIS_FILE}:{_line('ITEM-LINE')}" in message
    out, err = capfd.readouterr()
    assert "def forward" not in err and "Unable to find user code" not in err and not out


def test_data_dependent_shape_is_one_clear_error():
    with pytest.raises(TraceError, match=r"MaskSelect: aten.index has a data-dependent result"):
        nc.trace(MaskSelect(), (X,))


def test_export_failure_names_the_module():
    with pytest.raises(TraceError) as info:
        nc.trace(NotExportable(), (X,))
    message = str(info.value)
    assert message.startswith("NotExportable: torch.export failed: ")
    assert "\n" not in message


def test_unsupported_dtype_is_a_trace_error():
    with pytest.raises(TraceError, match=r"complex64 tensors are not supported \(input 'a'\)"):
        nc.trace(Named(), (IDS, X.to(torch.complex64)))


class Float64Rope(nn.Module):
    """Rotary angles computed in float64, as diffusers' Flux ``get_1d_rotary_pos_embed`` does
    (``freqs_dtype=torch.float64``), applied to a float32 input, and a float64 input's output."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x, pos, scale):
        omega = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
        angles = pos.to(torch.float64)[..., None] * omega  # [batch, seq, 8]
        cos = angles.cos().float().repeat_interleave(2, -1)
        sin = angles.sin().float().repeat_interleave(2, -1)
        pairs = self.proj(x).unflatten(-1, (8, 2))
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
        return self.proj(x) * cos + rotated * sin, (scale * 2.0).exp()


def test_float64_runs_in_fp32_as_on_neuron_and_returns_float64():
    """float64 tensors (inputs and intermediates) compute in FP32, as on Neuron (no FP64 datapath:
    torch-xla stores a double tensor's device data as f32 there), and float64 outputs return as
    float64 (before: 'float64 tensors are not supported'). The error is FP32 rounding: against
    torch in float64 within 1e-5 at positions up to 64, and the same as torch's own float32
    version of the computation."""
    torch.manual_seed(0)
    model = Float64Rope().eval()
    x = torch.randn(2, 6, 16)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [10, 20, 30, 40, 50, 64]])
    scale = torch.randn(3, 4, dtype=torch.float64)
    traced = nc.trace(model, (x, pos, scale))
    rope, scaled = traced(x, pos, scale)
    want_rope, want_scaled = model(x, pos, scale)
    assert rope.dtype == torch.float32 and scaled.dtype == torch.float64
    assert (rope - want_rope).abs().max() < 1e-5
    np.testing.assert_allclose(scaled.numpy(), want_scaled.numpy(), rtol=2e-6)
    assert (scaled - want_scaled).abs().max() > 0  # computed in FP32, not float64
    np.testing.assert_allclose(scaled.numpy(), (scale.float() * 2.0).exp().double().numpy(), rtol=1e-6)
    # and a training step through the float64 angles: the parameters after one SGD step as torch's
    trained, reference = Float64Rope(), Float64Rope()
    reference.load_state_dict(trained.state_dict())

    class Loss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, pos):
            return self.inner(x, pos, torch.zeros(1, dtype=torch.float64))[0].square().mean()

    step = nc.trace_train_step(Loss(trained), torch.optim.SGD(trained.parameters(), lr=0.5), (x, pos))
    step(x, pos)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    Loss(reference)(x, pos).backward()
    optimizer.step()
    for got, want in zip(trained.parameters(), reference.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)


def test_plain_function_can_be_traced():
    def scaled(a):
        return torch.tanh(a) * 3

    traced = nc.trace(scaled, (X,))
    assert_matches(traced(X), scaled(X))


def test_training_mode_module_is_traced_for_inference_and_left_as_it_was():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4))
    module.train()
    traced = nc.trace(module, (X,))
    assert module.training
    module.eval()
    assert_matches(traced(X), reference(module, (X,)))


# -- buckets ------------------------------------------------------------------------------------------


class TinyEncoder(nn.Module):
    """A BERT-like encoder: embeddings, masked self-attention (1 = attend), layer norm."""

    def __init__(self, vocab=50, d=32, heads=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, ids, mask):
        x = self.embed(ids)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias, -1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, d)
        return self.norm(x + self.out(ctx))


def test_buckets_pad_to_the_next_size_and_cut_the_output_back():
    torch.manual_seed(0)
    module = TinyEncoder().eval()
    ids = torch.randint(0, 50, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.int64)
    mask[1, 15:] = 0
    traced = nc.trace(module, (ids[:, :16], mask[:, :16]), buckets=[16, 32, 64])
    assert sorted(traced.programs) == [16, 32, 64]
    out = traced(ids, mask)
    assert out.shape == (2, 20, 32)
    assert [tuple(p.shape) for p in traced.last_result.program.graph.parameters] == [(2, 32), (2, 32)]
    expected = reference(module, (ids, mask))  # the framework's own, unpadded run
    assert_matches(out, expected)
    short = traced(ids[:, :9], mask[:, :9])
    assert_matches(short, reference(module, (ids[:, :9], mask[:, :9])))
    with pytest.raises(TraceError, match="larger than every bucket"):
        traced(torch.randint(0, 50, (2, 70)), torch.ones(2, 70, dtype=torch.int64))


def test_buckets_cut_every_dim_that_grows_with_the_length():
    """A default Llama returns its DynamicCache's keys and values, ``[batch, kv_heads, positions,
    head_dim]``: the positions are dim 2, not the bucket dim. They came back at the bucket's length
    (the padding's keys and values included); every output dim that grows with the buckets is cut."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(config).eval()

    def inputs(length: int) -> dict:
        ids = torch.randint(3, 128, (2, length))
        mask = torch.ones(2, length, dtype=torch.int64)
        mask[1, :2] = 0
        return {"input_ids": ids, "attention_mask": mask}

    traced = nc.trace(model, inputs(8), buckets=[8, 16])
    for length in (5, 8, 12):
        given = inputs(length)
        logits, keys, values = traced(**given)
        want = model(**given)
        layer = want.past_key_values.layers[0]
        assert logits.shape == (2, length, 128) and keys.shape == values.shape == (2, 2, length, 16)
        torch.testing.assert_close(logits, want.logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(keys, layer.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(values, layer.values, rtol=1e-4, atol=1e-5)
    # and a dim that only equals a bucket is left alone: BERT's pooled [batch, 64] at the 64 bucket
    bert = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        vocab_size=128)).eval()
    given = inputs(40)
    hidden, pooled = nc.trace(bert, inputs(32), buckets=[32, 64])(**given)
    assert hidden.shape == (2, 40, 64) and pooled.shape == (2, 64)
    torch.testing.assert_close(pooled, bert(**given).pooler_output, rtol=1e-4, atol=1e-5)


def test_batched_dots_over_linear_outputs_viewed_as_batches_match_torch():
    """SegFormer's efficient attention: q and v are Linear outputs ([128, 16] and [32, 16] rows)
    read as per-image batches ([2, 64, 16], [2, 16, 16]) by the batched dots. The reshape aliases
    the linear's tiles, and the dot located batch 1 in the root's unbatched shape: one tile past
    the last (IndexError in the compiler)."""

    class EfficientAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.v = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            q = self.q(x).reshape(2, 64, 1, 16).permute(0, 2, 1, 3)
            v = self.v(kv.reshape(32, 16)).reshape(2, 16, 1, 16).permute(0, 2, 1, 3)
            return torch.softmax(q @ v.transpose(-1, -2), -1) @ v

    torch.manual_seed(0)
    model = EfficientAttention().eval()
    x, kv = torch.randn(2, 64, 16), torch.randn(2, 16, 16)
    out = nc.trace(model, (x, kv))(x, kv)
    np.testing.assert_allclose(out.numpy(), model(x, kv).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["elu", "elu-alpha", "selu"])
def test_elu_and_selu_match_torch(act: str) -> None:
    """``nn.ELU`` / ``nn.SELU`` (``aten.elu`` with its ``alpha``, ``scale`` and ``input_scale``)
    were unsupported ops; large positive inputs must not read the exponential's overflow."""
    layer = {"elu": torch.nn.ELU(), "elu-alpha": torch.nn.ELU(alpha=0.5), "selu": torch.nn.SELU()}[act]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), layer, torch.nn.Linear(32, 4)).eval()
    x = torch.randn(8, 16) * 3.0
    x[0, :] = 60.0  # exp(> 88) overflows FP32
    assert not nc.check(model, (x,))
    got = nc.trace(model, (x,))(x).numpy()
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
