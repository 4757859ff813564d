"""The selective-scan (SSM) step of Mamba, fused, as the NKI Mamba tutorial develops it.

Inputs: delta, u [batch, channels, seq]; A [channels, state]; B, C [batch, state, seq]. Output
[batch, channels, seq] = sum over states of C * scan(exp(delta * A), delta * u * B). Channels map to
partitions. v1 loops states outside channel tiles (reloading delta and u); v2 keeps delta and u of a
channel tile across states; v3 also splits the sequence into 512-element chunks carrying the scan.
"""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import numpy as np


def _state_step(delta_t, u_t, a_col, b_row, c_row, init, width):
    P = nl.tile_size.pmax
    decay = nisa.activation(op=nl.exp, data=delta_t, scale=a_col)
    du = nisa.tensor_tensor(delta_t, u_t, op=nl.multiply)
    dbu = nisa.tensor_tensor(du, b_row.broadcast_to((P, width)), op=nl.multiply)
    h = nisa.tensor_tensor_scan(decay, dbu, initial=init, op0=np.multiply, op1=np.add)
    return h, nisa.tensor_tensor(h, c_row.broadcast_to((P, width)), op=nl.multiply)


@nki.jit
def mamba_v1(delta, u, A, B, C):
    batch, channels, seq = delta.shape
    _, states = A.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((batch, channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
    tiles = channels // P
    for bi in nl.affine_range(batch):
        total = nl.zeros((tiles, nl.par_dim(P), seq), dtype=delta.dtype)
        for s in nl.affine_range(states):
            for t in nl.affine_range(tiles):
                c0 = t * P
                d = nl.load(delta[bi, c0 : c0 + P, 0:seq])
                a = nl.load(A[c0 : c0 + P, s])
                x = nl.load(u[bi, c0 : c0 + P, 0:seq])
                b = nl.load(B[bi, s : s + 1, 0:seq])
                c = nl.load(C[bi, s : s + 1, 0:seq])
                _, y = _state_step(d, x, a, b, c, 0, seq)
                total[t, 0:P, 0:seq] += y
        for t in nl.affine_range(tiles):
            nl.store(out[bi, t * P : (t + 1) * P, 0:seq], total[t, 0:P, 0:seq])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    batch, channels, seq = delta.shape
    _, states = A.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((batch, channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
    for bi in nl.affine_range(batch):
        for t in nl.affine_range(channels // P):
            c0 = t * P
            total = nl.zeros((nl.par_dim(P), seq), dtype=delta.dtype)
            d = nl.load(delta[bi, c0 : c0 + P, 0:seq])
            x = nl.load(u[bi, c0 : c0 + P, 0:seq])
            for s in nl.affine_range(states):
                a = nl.load(A[c0 : c0 + P, s])
                b = nl.load(B[bi, s : s + 1, 0:seq])
                c = nl.load(C[bi, s : s + 1, 0:seq])
                _, y = _state_step(d, x, a, b, c, 0, seq)
                total[0:P, 0:seq] += y
            nl.store(out[bi, c0 : c0 + P, 0:seq], total[0:P, 0:seq])
    return out


@nki.jit
def mamba_v3(delta, u, A, B, C):
    batch, channels, seq = delta.shape
    _, states = A.shape
    P = nl.tile_size.pmax
    W = 512
    out = nl.ndarray((batch, channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
    for bi in nl.affine_range(batch):
        for t in nl.affine_range(channels // P):
            c0 = t * P
            total = nl.zeros((nl.par_dim(P), seq), dtype=delta.dtype)
            d = nl.load(delta[bi, c0 : c0 + P, 0:seq])
            x = nl.load(u[bi, c0 : c0 + P, 0:seq])
            for s in nl.affine_range(states):
                a = nl.load(A[c0 : c0 + P, s])
                carry = nl.zeros((P, 1), dtype=d.dtype)
                for w in nl.static_range(seq // W):
                    s0 = w * W
                    b = nl.load(B[bi, s : s + 1, s0 : s0 + W])
                    c = nl.load(C[bi, s : s + 1, s0 : s0 + W])
                    h, y = _state_step(d[0:P, s0 : s0 + W], x[0:P, s0 : s0 + W], a, b, c, carry, W)
                    carry[...] = h[0:P, W - 1]
                    total[0:P, s0 : s0 + W] += y
            nl.store(out[bi, c0 : c0 + P, 0:seq], total[0:P, 0:seq])
    return out
