"""``python -m neuroncore.nki``: run an NKI kernel file unchanged, or one kernel from shapes alone.

    python -m neuroncore.nki my_kernels.py [ARGS...]        # the file runs as __main__
    python -m neuroncore.nki my_kernels.py:nki_matmul_fully_optimized_ \\
        --shapes "8192x4096,8192x8192" --dtype bf16 --timing-only [--json]

The file's ``import neuronxcc.nki ...`` / ``import nki ...`` resolve to :mod:`neuroncore.nki` unless
the real package is installed (:mod:`neuroncore.nki.shim`). A kernel error (a constraint the hardware
imposes, an access out of bounds, an assertion of the kernel) is one line naming the kernel file and
line, and exit status 2. Under ``neuron-profile capture -- python -m neuroncore.nki FILE`` every
kernel call is recorded in the profile.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from neuroncore.nki import shim
from neuroncore.nki.api import Kernel, KernelRun, ShapeSpec, run_kernel
from neuroncore.nki.dtypes import resolve
from neuroncore.nki.errors import NkiError
from neuronscope.cli_kit import CliError, OneLineParser, run_command

PROG = "python -m neuroncore.nki"


def build_parser(kernel_mode: bool = False) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="FILE (run as a script) or FILE:KERNEL (one kernel from --shapes)")
    if not kernel_mode:  # everything after FILE belongs to the script
        parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script (FILE mode)")
    parser.add_argument("--shapes", help="KERNEL mode: comma-separated argument shapes, e.g. 128x512,512")
    parser.add_argument("--dtype", default="bf16", help="KERNEL mode: dtype of every argument (default bf16)")
    parser.add_argument(
        "--timing-only",
        action="store_true",
        help="KERNEL mode: time from shapes, no values (full sizes are fine)",
    )
    parser.add_argument("--json", action="store_true", help="KERNEL mode: one JSON line")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="KERNEL mode: a keyword argument of the kernel (an int or float)",
    )
    parser.add_argument("--instance", default=None, help="instance type (default trn1.2xlarge)")
    return parser


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            dims = tuple(int(d) for d in part.lower().split("x"))
        except ValueError:
            raise CliError(f"--shapes: {part!r} is not a shape like 128x512") from None
        if not dims or any(d <= 0 for d in dims):
            raise CliError(f"--shapes: {part!r} is not a shape like 128x512")
        shapes.append(dims)
    if not shapes:
        raise CliError("--shapes: no shapes given")
    return shapes


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def load_kernel(path: str, name: str) -> Any:
    if not os.path.isfile(path):
        raise CliError(f"no such kernel file: {path}")
    shim.install()
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    namespace = runpy.run_path(os.path.abspath(path), run_name="__nki_kernels__")
    kernel = namespace.get(name)
    if kernel is None:
        found = sorted(k for k, v in namespace.items() if isinstance(v, Kernel))
        raise CliError(f"{path} has no kernel {name!r}" + (f"; kernels: {', '.join(found)}" if found else ""))
    return kernel


def run_one(args: argparse.Namespace, path: str, name: str) -> int:
    kernel = load_kernel(path, name)
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    grid = kernel.grid if isinstance(kernel, Kernel) else ()
    if not args.shapes:
        raise CliError("FILE:KERNEL needs --shapes (e.g. --shapes 128x512,512x1024)")
    try:
        dtype = resolve(args.dtype)
    except ValueError as exc:
        raise CliError(f"--dtype: {exc}") from None
    shapes = parse_shapes(args.shapes)
    kwargs = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--set {item!r}: expected NAME=VALUE")
        kwargs[key] = _value(value)
    _check_arity(fn, name, len(shapes), kwargs)
    if args.timing_only:
        inputs: list[Any] = [ShapeSpec(s, dtype.name) for s in shapes]
    else:
        rng = np.random.default_rng(0)
        inputs = [dtype.cast(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    run = run_kernel(fn, inputs, kwargs, grid=grid, timing_only=args.timing_only, instance=args.instance)
    report(run, name, args.json)
    return 0


def _check_arity(fn: Any, name: str, n_shapes: int, kwargs: dict[str, Any]) -> None:
    """--shapes (one per positional argument) and --set must fit the kernel's parameters: a
    mismatch is one line naming them, not a TypeError from inside the kernel call."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(n_shapes), **kwargs)
    except TypeError as exc:
        raise CliError(f"{name}{signature}: --shapes gave {n_shapes} argument(s)"
                       f"{', --set ' + ', '.join(kwargs) if kwargs else ''}: {exc}") from None


def summary(run: KernelRun, name: str) -> dict[str, Any]:
    program = run.program
    return {
        "kernel": name,
        "latency_us": round(run.latency_us, 3),
        "hfu": round(run.hfu, 4),
        "mfu": round(run.mfu, 4),
        "flops": run.flops,
        "instructions": program.n_instructions,
        "dma_transfers": program.n_dma_transfers,
        "dma_bytes": int(program.dma_bytes.sum()),
        "core": program.spec.name,
    }


def report(run: KernelRun, name: str, as_json: bool) -> None:
    figures = summary(run, name)
    if as_json:
        print(json.dumps(figures))
        return
    print(
        f"{name}: {figures['latency_us']:.1f} us on one {figures['core']}, HFU {figures['hfu']:.1%}, "
        f"{figures['instructions']} instructions, {figures['dma_transfers']} DMA transfers "
        f"({figures['dma_bytes'] / 1e6:.1f} MB)"
    )


def run_file(path: str, argv: Sequence[str]) -> int:
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    shim.install()
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(os.path.abspath(path), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _kernel_assertion(exc: AssertionError) -> NkiError:
    """An ``assert`` in a kernel, named by its file and line."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = os.path.dirname(os.path.abspath(__file__))
    user = [
        f for f in frames if not os.path.abspath(f.filename).startswith(here) and "runpy" not in f.filename
    ]
    where = f"{user[-1].filename}:{user[-1].lineno}" if user else None
    return NkiError(f"assertion failed: {exc}" if str(exc) else "assertion failed", where)


def _is_kernel_target(token: str) -> bool:
    path, sep, name = token.rpartition(":")
    return bool(sep) and path.endswith(".py") and bool(name) and name.isidentifier()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    kernel_mode = any(_is_kernel_target(t) for t in argv if not t.startswith("-"))
    args = build_parser(kernel_mode).parse_args(argv)

    def body() -> int:
        target = args.target
        path, _, name = target.rpartition(":")
        try:
            if kernel_mode:
                return run_one(args, path, name)
            return run_file(target, args.args)
        except AssertionError as exc:
            raise _kernel_assertion(exc) from None

    return run_command(PROG, body, bad_input=(NkiError,))


__all__ = ["build_parser", "main", "parse_shapes", "summary"]
