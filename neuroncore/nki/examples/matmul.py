"""Matrix multiplication in four stages, as the NKI matmul tutorial develops it.

``result[M, N] = lhsT[K, M].T @ rhs[K, N]``. Stage 1 loads both tiles for every (m, n, k); stage 2
keeps a column of ``lhsT`` tiles for all of n; stage 3 blocks the free dims so each loaded tile feeds
two matmuls; stage 4 blocks all three dims, loads wide rows (2-4 KiB per partition) and accumulates
K-blocks in SBUF over a sequential loop.
"""

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

PM = nl.tile_size.pmax  # contraction rows per matmul (128)
SM = nl.tile_size.gemm_stationary_fmax  # output rows per matmul (128)
MN = nl.tile_size.gemm_moving_fmax  # output columns per matmul (512)


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mi in nl.affine_range(M // SM):
        for ni in nl.affine_range(N // MN):
            acc = nl.zeros((SM, MN), nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(K // PM):
                a = nl.load(lhsT[ki * PM : (ki + 1) * PM, mi * SM : (mi + 1) * SM])
                b = nl.load(rhs[ki * PM : (ki + 1) * PM, ni * MN : (ni + 1) * MN])
                acc += nl.matmul(a, b, transpose_x=True)
            nl.store(
                out[mi * SM : (mi + 1) * SM, ni * MN : (ni + 1) * MN], value=nl.copy(acc, dtype=out.dtype)
            )
    return out


@nki.jit
def matmul_hoisted(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    KT = K // PM
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    ia = nl.mgrid[0:PM, 0:SM]
    ib = nl.mgrid[0:PM, 0:MN]
    io = nl.mgrid[0:SM, 0:MN]
    for mi in nl.affine_range(M // SM):
        a_col = nl.ndarray((KT, nl.par_dim(PM), SM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for ki in nl.affine_range(KT):
            a_col[ki, ia.p, ia.x] = nl.load(lhsT[ki * PM + ia.p, mi * SM + ia.x])
        for ni in nl.affine_range(N // MN):
            b_col = nl.ndarray((KT, nl.par_dim(PM), MN), dtype=rhs.dtype, buffer=nl.sbuf)
            for ki in nl.affine_range(KT):
                b_col[ki, ib.p, ib.x] = nl.load(rhs[ki * PM + ib.p, ni * MN + ib.x])
            acc = nl.zeros((SM, MN), nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(KT):
                acc[...] += nl.matmul(a_col[ki, ia.p, ia.x], b_col[ki, ib.p, ib.x], transpose_x=True)
            nl.store(out[mi * SM + io.p, ni * MN + io.x], value=nl.copy(acc, dtype=out.dtype))
    return out


@nki.jit
def matmul_blocked_free(lhsT, rhs, BM=2, BN=2):
    K, M = lhsT.shape
    _, N = rhs.shape
    KT = K // PM
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    ia = nl.mgrid[0:PM, 0:SM]
    ib = nl.mgrid[0:PM, 0:MN]
    io = nl.mgrid[0:SM, 0:MN]
    for mb in nl.affine_range(M // (SM * BM)):
        a_blk = nl.ndarray((BM, KT, nl.par_dim(PM), SM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for j in nl.affine_range(BM):
            for ki in nl.affine_range(KT):
                a_blk[j, ki, ia.p, ia.x] = nl.load(lhsT[ki * PM + ia.p, (mb * BM + j) * SM + ia.x])
        for nb in nl.affine_range(N // (MN * BN)):
            b_blk = nl.ndarray((BN, KT, nl.par_dim(PM), MN), dtype=rhs.dtype, buffer=nl.sbuf)
            for j in nl.affine_range(BN):
                for ki in nl.affine_range(KT):
                    b_blk[j, ki, ib.p, ib.x] = nl.load(rhs[ki * PM + ib.p, (nb * BN + j) * MN + ib.x])
            for jm in nl.affine_range(BM):
                for jn in nl.affine_range(BN):
                    acc = nl.zeros((SM, MN), nl.float32, buffer=nl.psum)
                    for ki in nl.affine_range(KT):
                        acc += nl.matmul(
                            a_blk[jm, ki, ia.p, ia.x], b_blk[jn, ki, ib.p, ib.x], transpose_x=True
                        )
                    nl.store(
                        out[(mb * BM + jm) * SM + io.p, (nb * BN + jn) * MN + io.x],
                        value=nl.copy(acc, dtype=out.dtype),
                    )
    return out


@nki.jit
def matmul_fully_optimized(lhsT, rhs, BM=16, BN=2, BK=8):
    K, M = lhsT.shape
    _, N = rhs.shape
    WM, WN, WK = SM * BM, MN * BN, PM * BK  # block extents
    NM, NN, NK = M // WM, N // WN, K // WK
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for nb in nl.affine_range(NN):
        partial = nl.zeros((NM, BM, BN, nl.par_dim(SM), MN), dtype=lhsT.dtype, buffer=nl.sbuf)
        for kb in nl.sequential_range(NK):
            ib = nl.mgrid[0:PM, 0:WN]
            b_rows = nl.ndarray((BK, nl.par_dim(PM), WN), dtype=rhs.dtype, buffer=nl.sbuf)
            for j in nl.affine_range(BK):
                b_rows[j, ib.p, ib.x] = nl.load(rhs[(kb * BK + j) * PM + ib.p, nb * WN + ib.x])
            for mb in nl.affine_range(NM):
                ia = nl.mgrid[0:PM, 0:WM]
                a_rows = nl.ndarray((BK, nl.par_dim(PM), WM), dtype=lhsT.dtype, buffer=nl.sbuf)
                for j in nl.affine_range(BK):
                    a_rows[j, ia.p, ia.x] = nl.load(lhsT[(kb * BK + j) * PM + ia.p, mb * WM + ia.x])
                sa = nl.mgrid[0:PM, 0:SM]
                sb = nl.mgrid[0:PM, 0:MN]
                so = nl.mgrid[0:SM, 0:MN]
                for jn in nl.affine_range(BN):
                    for jm in nl.affine_range(BM):
                        acc = nl.zeros((SM, MN), dtype=nl.float32, buffer=nl.psum)
                        for j in nl.affine_range(BK):
                            acc[...] += nisa.nc_matmul(
                                a_rows[j, sa.p, jm * SM + sa.x], b_rows[j, sb.p, jn * MN + sb.x]
                            )
                        partial[mb, jm, jn, so.p, so.x] += acc[so.p, so.x]
        for mb in nl.affine_range(NM):
            for jm in nl.affine_range(BM):
                so = nl.mgrid[0:SM, 0:MN]
                row = nl.mgrid[0:SM, 0:WN]
                packed = nl.ndarray((SM, WN), dtype=partial.dtype, buffer=nl.sbuf)
                for jn in nl.affine_range(BN):
                    packed[so.p, jn * MN + so.x] = nl.copy(partial[mb, jm, jn, so.p, so.x])
                nl.store(out[(mb * BM + jm) * SM + row.p, nb * WN + row.x], value=packed[row.p, row.x])
    return out


STAGES = {
    "tiled": matmul_tiled,
    "hoisted_loads": matmul_hoisted,
    "blocked_free_dim": matmul_blocked_free,
    "fully_optimized": matmul_fully_optimized,
}
