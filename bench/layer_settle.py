"""Where a prefill's run of layers settles, and what differs at the boundaries before it.

For one ``bench/llm_decode.py`` program (``--model --instance --batch --context``, prefill by
default) this builds the rank graph as ``simulate`` does, lowers it with the layer replay watched
(``LayerDedup``), and prints one JSON line: each run's layers, the boundary and period where its
state repeated (``settled_at``, ``period``), the layers relocated and lowered in full, and for each
boundary before the match which parts of the snapshot differ from the boundaries one to three
layers earlier (``diffs``: the snapshot field and up to ``--detail`` differing entries).
``--stop`` ends the compile at the first relocation (the diagnostic needs nothing after it: a big
prefill's whole program may not fit in memory). Figures only; nothing here changes a program.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.llm_decode import INSTANCES, MODELS
from neuroncore.compiler import compile as compile_graph
from neuroncore.compiler import layer_replay
from neuroncore.parallel.sharding import shard
from neuroncore.runtime.device import Instance
from neuroncore.workloads import get


class _Stop(Exception):
    """Raised at the first relocation under ``--stop``."""


def diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    """Paths (and the two values, shortened) where ``a`` and ``b`` differ, up to ``limit``."""
    if len(out) >= limit or a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in a or key not in b:
                out.append(f"{path}[{key!r}] only in {'earlier' if key in a else 'later'}: "
                           f"{_short(a.get(key, b.get(key)))}")
            else:
                diff(a[key], b[key], f"{path}[{key!r}]", out, limit)
            if len(out) >= limit:
                return
        return
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            diff(x, y, f"{path}[{i}]", out, limit)
            if len(out) >= limit:
                return
        return
    out.append(f"{path}: {_short(a)} != {_short(b)}")


def _short(v: Any, n: int = 240) -> str:
    text = repr(v)
    return text if len(text) <= n else text[:n] + f"...({len(text)} chars)"


def watch(graph: Any, core: Any, *, stop: bool, detail: int) -> dict[str, Any]:
    """Compile ``graph`` with the replay watched; returns the figures (see the module docstring)."""
    snaps: dict[tuple[int, int], dict[str, Any]] = {}
    runs: dict[int, dict[str, Any]] = {}
    original_snapshot = layer_replay.LayerDedup._snapshot
    original_replay = layer_replay.LayerDedup._replay

    def _snapshot(self: Any, run: Any, k: int, frame: Any) -> dict[str, Any]:
        snap = original_snapshot(self, run, k, frame)
        snaps[(id(run), k)] = snap
        runs.setdefault(id(run), {"layers": len(run.layers), "first_op": run.layers[0].start,
                                  "loose": len(run.loose), "quiet": id(run) in self.quiet,
                                  "keep": id(run) in self.keep})
        return snap

    def _replay(self: Any, run: Any, k: int, period: int) -> int:
        before = self.replayed
        resume = original_replay(self, run, k, period)
        info = runs[id(run)]
        info.update(settled_at=k, period=period, relocated=self.replayed - before)
        info["lowered_in_full"] = len(run.layers) - info["relocated"]
        if stop:
            raise _Stop
        return resume

    layer_replay.LayerDedup._snapshot = _snapshot  # type: ignore[method-assign]
    layer_replay.LayerDedup._replay = _replay  # type: ignore[method-assign]
    cpu = time.process_time()
    try:
        program = compile_graph(graph, core)
        total = program.stats.get("layers_relocated", 0)
    except _Stop:
        total = None
    finally:
        layer_replay.LayerDedup._snapshot = original_snapshot  # type: ignore[method-assign]
        layer_replay.LayerDedup._replay = original_replay  # type: ignore[method-assign]
    cpu = time.process_time() - cpu
    for rid, info in runs.items():
        ks = sorted(k for r, k in snaps if r == rid)
        diffs = {}
        for k in ks:
            for period in layer_replay.PERIODS:
                earlier = snaps.get((rid, k - period))
                if earlier is None or k - period < 1:
                    continue
                out: list[str] = []
                diff(earlier, snaps[(rid, k)], "", out, detail)
                fields = sorted({p.split("]")[0].strip("[']") for p in out})
                diffs[f"{k - period}->{k}"] = {"fields": fields, "first": out} if out else "equal"
        info["boundaries"] = ks
        info["diffs"] = diffs
    return {"runs": list(runs.values()), "layers_relocated": total, "cpu_s": round(cpu, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--instance", default="inf2.48xlarge")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--workload", default="llama-prefill")
    parser.add_argument("--stop", action="store_true", help="end at the first relocation")
    parser.add_argument("--detail", type=int, default=6, help="differing entries shown per boundary pair")
    args = parser.parse_args(argv)
    if args.instance not in INSTANCES:
        print(f"layer_settle: unknown instance {args.instance!r} (one of {', '.join(INSTANCES)})",
              file=sys.stderr)
        return 2
    if args.model not in MODELS:
        print(f"layer_settle: unknown model {args.model!r} (one of {', '.join(MODELS)})", file=sys.stderr)
        return 2
    tp = INSTANCES[args.instance]
    graph = get(args.workload).graph(args.model, batch=args.batch, context=args.context, tp_degree=tp)
    local = shard(graph, tp).local
    figures = watch(local, Instance(args.instance).spec.chip.core, stop=args.stop, detail=args.detail)
    print(json.dumps({"program": [args.workload, args.model, args.instance, args.batch, args.context],
                      **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
