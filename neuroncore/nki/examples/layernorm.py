"""LayerNorm over the last dim of a [rows, cols] tensor, as the NKI layernorm tutorial writes it:
version 1 with ``nki.language`` math, version 2 with ``bn_stats``/``bn_aggr`` and one two-step
``tensor_scalar``. Rows map to partitions, 128 at a time; a mask covers a last partial tile."""

import math

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


def _params(gamma, beta, cols):
    one = nl.arange(1)[:, None]
    f = nl.arange(cols)[None, :]
    g = nl.load(gamma.reshape((1, cols))[one, f])
    b = nl.load(beta.reshape((1, cols))[one, f])
    return g.broadcast_to((nl.tile_size.pmax, cols)), b.broadcast_to((nl.tile_size.pmax, cols))


@nki.jit
def layernorm_v1(x, eps, gamma, beta):
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(nl.tile_size.pmax)[:, None]
    f = nl.arange(cols)[None, :]
    g, b = _params(gamma, beta, cols)
    for t in nl.affine_range(math.ceil(rows / nl.tile_size.pmax)):
        inside = t * nl.tile_size.pmax + ip < rows
        xt = nl.load(x[t * nl.tile_size.pmax + ip, f], mask=inside)
        mu = nl.mean(xt, axis=1)
        var = nl.mean(nl.square(xt), axis=1) - mu * mu
        y = (xt - mu) * nl.rsqrt(var + eps)
        nl.store(out[t * nl.tile_size.pmax + ip, f], value=y * g + b, mask=inside)
    return out


@nki.jit
def layernorm_v2(x, eps, gamma, beta):
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(nl.tile_size.pmax)[:, None]
    f = nl.arange(cols)[None, :]
    g, b = _params(gamma, beta, cols)
    chunk = nl.tile_size.bn_stats_fmax
    chunks = math.ceil(cols / chunk)
    fc = nl.arange(chunk)[None, :]
    six = nl.arange(6)[None, :]
    for t in nl.affine_range(math.ceil(rows / nl.tile_size.pmax)):
        inside = t * nl.tile_size.pmax + ip < rows
        xt = nl.load(x[t * nl.tile_size.pmax + ip, f], mask=inside)
        stats = nl.ndarray((nl.tile_size.pmax, 6 * chunks), dtype=nl.float32)
        for c in nl.affine_range(chunks):
            stats[ip, c * 6 + six] = nisa.bn_stats(
                xt[ip, c * chunk + fc], mask=(c * chunk + fc < cols), dtype=nl.float32
            )
        allstats = nl.arange(6 * chunks)[None, :]
        mv = nisa.bn_aggr(stats[ip, allstats])
        scale = nl.rsqrt(mv[ip, 1] + eps)
        y = nisa.tensor_scalar(data=xt, op0=nl.subtract, operand0=mv[ip, 0], op1=nl.multiply, operand1=scale)
        nl.store(out[t * nl.tile_size.pmax + ip, f], value=y * g + b, mask=inside)
    return out
