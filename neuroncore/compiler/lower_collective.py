"""Collectives (all-reduce, all-gather, reduce-scatter, collective-permute) of a parallel program:
one CC-core node each.

A collective works on device memory, as the Neuron runtime's do: the operand's tiles are stored to
HBM, the CC-core runs the operation over NeuronLink into a fresh HBM tensor, and consumers load
their tiles from there. The node's duration is not known at compile time (it depends on which cores
the ranks land on), so the runtime supplies it; the compiler only says what it reads and writes.
"""

from __future__ import annotations

from neuroncore.compiler.context import Context
from neuroncore.compiler.counters import NodeCounters
from neuroncore.compiler.lowering_state import HbmTensorKind
from neuroncore.compiler.node_semantics import Collective
from neuroncore.compiler.program import HbmAccess
from neuroncore.enums import Memory
from neuroncore.ir.graph import Op

CC_OPCODES = {"all-reduce": "ALL_REDUCE", "all-gather": "ALL_GATHER", "reduce-scatter": "REDUCE_SCATTER",
              "collective-permute": "PERMUTE"}


def lower_collective(ctx: Context, op: Op) -> None:
    src = op.operands[0]
    source = ctx.ensure_hbm(src)
    target = ctx.hbm_tensor(f"{op.name}.cc", op, HbmTensorKind.SCRATCH)
    ctx.define(op, home=Memory.HBM, hbm=target)
    whole_src = HbmAccess(source, 0, 0, 1, 0, 1)
    whole_dst = HbmAccess(target, 0, 0, 1, 0, 1)
    reads = ctx.hbm_rects(HbmAccess(source, 0, 0, 1, 0, 1, view="whole"), 1)
    writes = ctx.hbm_rects(HbmAccess(target, 0, 0, 1, 0, 1, view="whole"), 1)
    nbytes = src.nbytes
    detail = f" dim={op.attrs['dimension']}" if op.opcode == "all-gather" else ""
    ctx.em.collective(
        CC_OPCODES[op.opcode],
        reads=reads,
        writes=writes,
        text=f"{op.opcode} hbm:{source} -> hbm:{target} {nbytes}B {op.dtype.value}{detail}",
        semantics=Collective(op.index, whole_src, whole_dst),
        counters=NodeCounters(hbm_read_bytes=nbytes, hbm_write_bytes=op.nbytes),
    )


__all__ = ["CC_OPCODES", "lower_collective"]
