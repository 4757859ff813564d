"""Fuzz the profile tools with broken and hostile profile folders; prints ONE JSON line of counts.

    python bench/fuzz_profiles.py                 # 10,000 cases (about 5-8 minutes on 2 loaded cores)
    python bench/fuzz_profiles.py --cases 500     # a quick run
    python bench/fuzz_profiles.py --seed 7 --show 5   # another sequence; print 5 crash examples

A small profile (bert-layer, one execution) and a two-profile dataset folder of it are recorded once.
Each case copies one of them and applies one to three mutations (``MUTATIONS``: bit flips, truncation,
zeroed ranges, deleted or swapped tables, wrong column types, empty or duplicate column names, nulls,
extreme values -- near-int64-max durations, NaN, huge strings --, FIFOs, sockets, devices and symlinks
in place of parts, links out of the profile, 10,000 empty parts, odd file names, a newer or garbled
schema version). The folder then goes through every entry point IN-PROCESS, through the same
functions the console scripts call:

* ``view``      -- ``neuron-profile view DIR --output-format summary-json``
* ``recompute`` -- ``neuron-profile view DIR --output-format summary-text --recompute``
* ``query``     -- ``neuron-profile query DIR "SELECT engine, count(*), sum(duration_ns) ..."`` (table
  output), or ``SELECT * FROM Summary`` as JSON, or ``SELECT * FROM Metadata`` as CSV (by case)
* ``validate``  -- ``neuron-profile validate DIR``
* ``reader``    -- ``formats.reader.open_profile`` and every table decoded

A **crash** is an exception escaping ``main`` (a traceback), an exit code other than 0/1/2, or an exit
2 whose stderr is not one line; for the reader, any exception but ``ProfileError``. A **hang** is an
entry point still running after ``--timeout`` seconds (the case runs in a worker process, which is
killed and replaced). Workers run cases in parallel (``--workers``).

Output: ``{"cases": N, "seed": S, "seconds": T, "entry": {"view": {"runs", "ok", "refused", "crashes",
"hangs"}, ...}, "crashes": C, "hangs": H}``; crash examples (entry, mutations, last line) on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ENTRIES = ("view", "recompute", "query", "validate", "reader")
QUERIES = (("SELECT engine, count(*) AS n, sum(duration_ns) AS t FROM Instruction GROUP BY 1 ORDER BY 1",
            "table"), ("SELECT * FROM Summary", "json"), ("SELECT * FROM Metadata", "csv"))


# -- base profiles (recorded once) ------------------------------------------------------------------

def make_bases(directory: Path) -> list[Path]:
    """A one-execution bert-layer profile and a dataset folder holding two copies of it."""
    import neuroncore as nc
    from formats.recorder import record_profile
    from neuroncore import workloads

    single = directory / "single"
    sink = nc.EventSink()
    instance = nc.Instance("trn1.2xlarge", sink=sink)
    program = nc.compile(workloads.get("bert-layer").graph(), "trn1")
    with record_profile(single, sink, metadata={"instance_type": instance.name}):
        instance.core(0).load(program).execute(timing_only=True)
    dataset = directory / "dataset"
    for core in (0, 1):
        shutil.copytree(single, dataset / "model=bert" / f"core={core}" / "execution=1")
    return [single, dataset]


# -- mutations ------------------------------------------------------------------------------------

def _profiles(root: Path) -> list[Path]:
    return sorted({p.parent for p in root.rglob("*.parquet")}) or [root]


def _parts(root: Path, rng: random.Random) -> tuple[Path, list[Path]]:
    profile = rng.choice(_profiles(root))
    parts = sorted(p for p in profile.iterdir() if p.name.endswith(".parquet") and p.is_file()
                   and not p.is_symlink())
    return profile, parts


def _pick(root: Path, rng: random.Random) -> Path | None:
    _, parts = _parts(root, rng)
    return rng.choice(parts) if parts else None


def bitflip(root: Path, rng: random.Random) -> None:
    part = _pick(root, rng)
    if part is None:
        return
    data = bytearray(part.read_bytes())
    for _ in range(rng.choice((1, 1, 1, 2, 8))):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    part.write_bytes(bytes(data))


def truncate(root: Path, rng: random.Random) -> None:
    part = _pick(root, rng)
    if part is not None:
        data = part.read_bytes()
        part.write_bytes(data[: rng.randrange(len(data) + 1)])


def zero_range(root: Path, rng: random.Random) -> None:
    part = _pick(root, rng)
    if part is None:
        return
    data = bytearray(part.read_bytes())
    start = rng.randrange(len(data) or 1)
    length = rng.choice((1, 4, 16, 256))
    data[start:start + length] = bytes(len(data[start:start + length]))
    part.write_bytes(bytes(data))


def garbage(root: Path, rng: random.Random) -> None:
    part = _pick(root, rng)
    if part is not None:
        body = rng.randbytes(rng.randrange(1, 4096))
        part.write_bytes(rng.choice((body, b"PAR1" + body + b"PAR1", b"")))


def delete(root: Path, rng: random.Random) -> None:
    part = _pick(root, rng)
    if part is not None:
        part.unlink()


def swap(root: Path, rng: random.Random) -> None:
    """One table's file under another table's name."""
    _, parts = _parts(root, rng)
    if len(parts) >= 2:
        a, b = rng.sample(parts, 2)
        shutil.copyfile(a, b)


def _rewrite(root: Path, rng: random.Random, change: Callable[[pa.Table, random.Random], pa.Table]) -> None:
    part = _pick(root, rng)
    if part is None:
        return
    try:
        table = pq.read_table(part)
    except (OSError, pa.ArrowException, ValueError):  # ValueError: a name or footer that is not UTF-8
        return
    if table.num_columns == 0:
        return
    try:
        table = change(table, rng)
        pq.write_table(table, part)
    except (pa.ArrowException, ValueError, TypeError, OverflowError, UnicodeError):
        part.write_bytes(b"")  # pyarrow may leave a half-written file: make it plainly empty


def _set(table: pa.Table, index: int, array: pa.Array | pa.ChunkedArray, name: str | None = None) -> pa.Table:
    return table.set_column(index, name if name is not None else table.column_names[index], array)


def retype(root: Path, rng: random.Random) -> None:
    def change(table: pa.Table, rng: random.Random) -> pa.Table:
        i = rng.randrange(table.num_columns)
        values = table.column(i).to_pylist()
        kind = rng.choice(("string", "float", "int", "bool", "null", "binary", "list", "struct"))
        if kind == "string":
            return _set(table, i, pa.array([None if v is None else str(v) for v in values], pa.string()))
        if kind == "float":
            return _set(table, i, pa.array([rng.random() * 1e6 for _ in values], pa.float64()))
        if kind == "int":
            return _set(table, i, pa.array([rng.randrange(-5, 5) for _ in values], pa.int8()))
        if kind == "bool":
            return _set(table, i, pa.array([rng.random() < 0.5 for _ in values]))
        if kind == "null":
            return _set(table, i, pa.nulls(len(values)))
        if kind == "binary":
            return _set(table, i, pa.array([rng.randbytes(3) for _ in values], pa.binary()))
        if kind == "list":
            return _set(table, i, pa.array([[1, 2]] * len(values), pa.list_(pa.int64())))
        return _set(table, i, pa.array([{"a": 1}] * len(values)))
    _rewrite(root, rng, change)


def rename_column(root: Path, rng: random.Random) -> None:
    def change(table: pa.Table, rng: random.Random) -> pa.Table:
        names = list(table.column_names)
        i = rng.randrange(len(names))
        names[i] = rng.choice(("", " ", '"', "a\nb", "x" * 5000, names[(i + 1) % len(names)],
                               "\udcff", "'; DROP TABLE x; --", "start_ts"))
        try:
            return table.rename_columns(names)
        except (pa.ArrowException, UnicodeEncodeError):
            return table
    _rewrite(root, rng, change)


def nulls(root: Path, rng: random.Random) -> None:
    def change(table: pa.Table, rng: random.Random) -> pa.Table:
        i = rng.randrange(table.num_columns)
        return _set(table, i, pa.nulls(table.num_rows, table.schema.field(i).type))
    _rewrite(root, rng, change)


EXTREME_INTS = (2**63 - 1, -(2**63), 2**63 - 2, -1, 0, 2**62, 10**18)
EXTREME_FLOATS = (float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324)


def extreme(root: Path, rng: random.Random) -> None:
    """Near-int64-max durations and timestamps, NaN/Inf floats, huge or odd strings."""
    def change(table: pa.Table, rng: random.Random) -> pa.Table:
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(table.num_columns)
            t = table.schema.field(i).type
            n = table.num_rows
            if pa.types.is_integer(t):
                value = rng.choice(EXTREME_INTS)
                picks = [value if rng.random() < 0.5 else rng.choice(EXTREME_INTS) for _ in range(n)]
                array = pa.array(picks, pa.int64())
                table = _set(table, i, array.cast(t, safe=False))
            elif pa.types.is_floating(t):
                table = _set(table, i, pa.array([rng.choice(EXTREME_FLOATS) for _ in range(n)], t))
            elif pa.types.is_string(t) or pa.types.is_large_string(t):
                value = rng.choice(("", "x" * 100_000, "\x00", "é" * 10, "\n\r\t", "Tensor", "tensor"))
                table = _set(table, i, pa.array([value] * n, t))
            elif pa.types.is_timestamp(t):
                table = _set(table, i, pa.array([rng.choice(EXTREME_INTS)] * n, pa.int64()).cast(t))
        return table
    _rewrite(root, rng, change)


def schema_version(root: Path, rng: random.Random) -> None:
    def change(table: pa.Table, rng: random.Random) -> pa.Table:
        if "profile_schema_version" not in table.column_names:
            return table
        value = rng.choice(("99.0.0", "7.99.0", "abc", "", "7", "-1.0.0", "7.4.0.1", None, "9" * 400))
        i = table.schema.get_field_index("profile_schema_version")
        return _set(table, i, pa.array([value] * table.num_rows, pa.string()))
    profile = rng.choice(_profiles(root))
    if (profile / "Metadata.parquet").is_file() and not (profile / "Metadata.parquet").is_symlink():
        try:
            table = change(pq.read_table(profile / "Metadata.parquet"), rng)
            pq.write_table(table, profile / "Metadata.parquet")
        except (OSError, pa.ArrowException):
            pass


def extra_table(root: Path, rng: random.Random) -> None:
    """An unknown table, or a split part, with types the schema never uses."""
    profile = rng.choice(_profiles(root))
    columns = {
        "start_ts": pa.array([2**63 - 1, 0], pa.int64()),
        "when": pa.array([0, 2**62], pa.timestamp("ns")),
        "amount": pa.array([1, 2], pa.decimal128(38, 0)),
        "blob": pa.array([b"\x00", b"\xff"], pa.binary()),
        "mapping": pa.array([[("a", 1)], []], pa.map_(pa.string(), pa.int64())),
        "day": pa.array([0, 1], pa.date32()),
    }
    chosen = rng.sample(sorted(columns), rng.randrange(1, len(columns)))
    name = rng.choice(("Mystery.parquet", "Instruction_7.parquet", "Summary_0.parquet", "Metadata_1.parquet",
                       "DmaPacket_3.parquet"))
    with contextlib.suppress(OSError, pa.ArrowException):
        pq.write_table(pa.table({c: columns[c] for c in chosen}), profile / name)


def _replace(root: Path, rng: random.Random) -> Path | None:
    part = _pick(root, rng)
    if part is not None:
        part.unlink()
    return part


def fifo(root: Path, rng: random.Random) -> None:
    part = _replace(root, rng)
    if part is not None:
        os.mkfifo(part)


def link_to_fifo(root: Path, rng: random.Random) -> None:
    part = _replace(root, rng)
    if part is not None:
        pipe = part.parent / f".pipe{rng.randrange(10**6)}"
        os.mkfifo(pipe)
        part.symlink_to(pipe)


def unix_socket(root: Path, rng: random.Random) -> None:
    part = _replace(root, rng)
    if part is not None and len(str(part)) < 100:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(part))


def link_out(root: Path, rng: random.Random) -> None:
    """A part that is a link to a file outside the profile (a copy of itself, /etc/hostname, /dev/zero)."""
    part = _pick(root, rng)
    if part is None:
        return
    target = rng.choice(("copy", "/etc/hostname", "/dev/zero", "/dev/null", "/", "/nonexistent", "self"))
    if target == "copy":
        outside = root.parent / f"outside-{rng.randrange(10**9)}.parquet"
        shutil.copyfile(part, outside)
        target = str(outside)
    part.unlink()
    part.symlink_to(part if target == "self" else target)


def directory(root: Path, rng: random.Random) -> None:
    part = _replace(root, rng)
    if part is not None:
        part.mkdir()


def many_empty(root: Path, rng: random.Random) -> None:
    profile = rng.choice(_profiles(root))
    table = rng.choice(("Instruction", "Mystery", "DmaPacket"))
    for i in range(10_000):
        (profile / f"{table}_{i}.parquet").touch()


def odd_names(root: Path, rng: random.Random) -> None:
    part = _pick(root, rng)
    if part is None:
        return
    stem = os.fsencode(part.name.removesuffix(".parquet"))  # an earlier odd name may hold undecodable bytes
    name = rng.choice((b"x" * 247 + b".parquet", b"\xff\xfe.parquet", stem + b"_\xff.parquet",
                       stem + b"_99999999999999999999999.parquet", b"Instruction_-1.parquet",
                       b" .parquet", b".parquet"))
    with contextlib.suppress(OSError):
        shutil.copyfile(part, os.path.join(os.fsencode(part.parent), name))


MUTATIONS: dict[str, Callable[[Path, random.Random], None]] = {
    "bitflip": bitflip, "truncate": truncate, "zero_range": zero_range, "garbage": garbage,
    "delete": delete, "swap": swap, "retype": retype, "rename_column": rename_column, "nulls": nulls,
    "extreme": extreme, "schema_version": schema_version, "extra_table": extra_table, "fifo": fifo,
    "link_to_fifo": link_to_fifo, "socket": unix_socket, "link_out": link_out, "directory": directory,
    "many_empty": many_empty, "odd_names": odd_names,
}
# Relative frequencies: byte-level damage and value changes most often; 10k files rarely (slow to make).
WEIGHTS = {"bitflip": 8, "truncate": 4, "zero_range": 3, "garbage": 2, "delete": 3, "swap": 2, "retype": 5,
           "rename_column": 3, "nulls": 3, "extreme": 6, "schema_version": 2, "extra_table": 2, "fifo": 1,
           "link_to_fifo": 1, "socket": 1, "link_out": 2, "directory": 1, "many_empty": 0.05, "odd_names": 1}


def make_case(base: Path, dest: Path, rng: random.Random, mutations: list[str] | None = None) -> list[str]:
    """Copy ``base`` to ``dest`` and apply ``mutations`` (default: one to three drawn by weight)."""
    shutil.copytree(base, dest, symlinks=True)
    if mutations is None:
        names = list(WEIGHTS)
        mutations = rng.choices(names, weights=[WEIGHTS[n] for n in names], k=rng.choice((1, 1, 2, 3)))
    for name in mutations:
        MUTATIONS[name](dest, rng)
    return mutations


# -- entry points -------------------------------------------------------------------------------

def _cli(argv: list[str]) -> tuple[str, str]:
    """Run ``neuron-profile`` in-process: ("ok"|"refused"|"crash", detail)."""
    from formats.profile_commands import main

    # Real streams' encodings: stdout UTF-8 strict (a lone surrogate raises, as on a terminal or pipe),
    # stderr with Python's backslashreplace.
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    err.getvalue = lambda: (err.flush(), err.buffer.getvalue().decode("utf-8", "replace"))[1]  # type: ignore[attr-defined]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
            out.flush()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
        if code != 0 and err.getvalue().count("\n") != 1:
            return "crash", f"SystemExit {exc.code}: {err.getvalue()[-300:]!r}"
    except BaseException as exc:  # a crash is what we count
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        return "crash", f"{type(exc).__name__} at {where}: {str(exc)[:200]}"
    text = err.getvalue()
    if code not in (0, 1, 2):
        return "crash", f"exit {code}: {text[-300:]!r}"
    if code == 2 and (text.count("\n") != 1 or "Traceback" in text):
        return "crash", f"exit 2 without one line: {text[-300:]!r}"
    return ("ok" if code in (0, 1) else "refused"), text.strip()[:200]


def _reader(path: Path) -> tuple[str, str]:
    from formats.dataset import find_profiles
    from formats.reader import ProfileError, open_profile

    try:
        entries, _ = find_profiles(path, include_incomplete=True)
        for entry in entries:
            profile = open_profile(entry.path)
            for name in profile.tables:
                for _ in profile.iter_batches(name):
                    pass
    except ProfileError as exc:
        text = str(exc)
        if "\n" in text:
            return "crash", f"ProfileError with several lines: {text[:200]!r}"
        return "refused", text[:200]
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        return "crash", f"{type(exc).__name__} at {where}: {str(exc)[:200]}"
    return "ok", ""


def run_entry(entry: str, path: Path, variant: int = 0) -> tuple[str, str]:
    """One entry point on one profile folder: ("ok"|"refused"|"crash", detail). ``variant`` picks
    the query (``QUERIES``)."""
    p = str(path)
    if entry == "view":
        return _cli(["view", p, "--output-format", "summary-json", "--include-incomplete"])
    if entry == "recompute":
        return _cli(["view", p, "--output-format", "summary-text", "--recompute", "--include-incomplete"])
    if entry == "query":
        sql, fmt = QUERIES[variant % len(QUERIES)]
        return _cli(["query", p, sql, "--include-incomplete", "--format", fmt])
    if entry == "validate":
        return _cli(["validate", p])
    return _reader(path)


# -- the run ------------------------------------------------------------------------------------

def _worker(conn: Any, bases: list[str], scratch: str, seed: int) -> None:
    """Run cases sent by the parent; report ("start", entry) before each entry point and ("done",
    results) after a case, so a hang is attributed to the entry point that hung."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    while True:
        job = conn.recv()
        if job is None:
            return
        case_id = job
        rng = random.Random(seed * 1_000_003 + case_id)
        base = Path(bases[0] if rng.random() < 0.8 else bases[1])
        dest = Path(scratch) / f"case{case_id}"
        try:
            try:
                mutations = make_case(base, dest, rng)
            except Exception as exc:  # the harness's own failure: not a crash of any entry point
                conn.send(("harness", f"case {case_id}: {type(exc).__name__}: {exc}"))
                continue
            results = {}
            for entry in ENTRIES:
                conn.send(("start", entry))
                began = time.perf_counter()
                outcome, detail = run_entry(entry, dest, case_id)
                results[entry] = (outcome, detail, time.perf_counter() - began)
            conn.send(("done", (mutations, results)))
        finally:
            shutil.rmtree(dest, ignore_errors=True)
            for stray in Path(scratch).glob("outside-*"):
                stray.unlink(missing_ok=True)


class _Pool:
    """Worker processes with a per-entry time limit; a worker that overruns is killed and replaced."""

    def __init__(self, workers: int, bases: list[Path], scratch: Path, seed: int, timeout: float) -> None:
        self.context = mp.get_context("fork")
        self.bases, self.scratch, self.seed, self.timeout = [str(b) for b in bases], scratch, seed, timeout
        self.slots: list[dict[str, Any]] = [self._spawn(i) for i in range(workers)]

    def _spawn(self, index: int) -> dict[str, Any]:
        parent, child = self.context.Pipe()
        folder = self.scratch / f"w{index}-{time.monotonic_ns()}"
        folder.mkdir()
        process = self.context.Process(target=_worker, args=(child, self.bases, str(folder), self.seed),
                                       daemon=True)
        process.start()
        child.close()
        return {"conn": parent, "process": process, "case": None, "entry": None, "since": 0.0,
                "index": index, "folder": folder}

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(OSError, BrokenPipeError):
                slot["conn"].send(None)
            slot["process"].join(5)
            if slot["process"].is_alive():
                slot["process"].kill()


def run(cases: int, seed: int, workers: int, timeout: float, show: int,
        max_seconds: float | None = None) -> dict[str, Any]:
    counts: dict[str, dict[str, float]] = {
        e: {"runs": 0, "ok": 0, "refused": 0, "crashes": 0, "hangs": 0, "seconds": 0.0} for e in ENTRIES}
    examples: list[str] = []
    harness_errors = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-profiles-") as tmp:
        scratch = Path(tmp)
        bases = make_bases(scratch / "bases")
        pool = _Pool(workers, bases, scratch, seed, timeout)
        next_case = 0
        done = 0
        from multiprocessing.connection import wait

        def assign(slot: dict[str, Any]) -> None:
            nonlocal next_case, cases
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                cases = min(cases, next_case)  # out of time: finish the cases under way, start no more
            if next_case < cases:
                slot["conn"].send(next_case)
                slot["case"], slot["entry"], slot["since"] = next_case, None, time.monotonic()
                next_case += 1
            else:
                slot["case"] = None

        for slot in pool.slots:
            assign(slot)
        while done < cases:
            busy = [s for s in pool.slots if s["case"] is not None]
            ready = wait([s["conn"] for s in busy], timeout=0.5)
            for slot in busy:
                kind = None
                if slot["conn"] in ready:
                    try:
                        kind, payload = slot["conn"].recv()
                    except (EOFError, OSError):
                        kind, payload = "died", None
                    if kind == "start":
                        slot["entry"], slot["since"] = payload, time.monotonic()
                        continue
                    if kind == "harness":
                        harness_errors += 1
                        examples.append(f"harness {payload}")
                        done += 1
                        assign(slot)
                        continue
                    if kind == "done":
                        mutations, results = payload
                        for entry, (outcome, detail, seconds) in results.items():
                            counts[entry]["runs"] += 1
                            counts[entry]["seconds"] += seconds
                            key = {"ok": "ok", "refused": "refused", "crash": "crashes"}[outcome]
                            counts[entry][key] += 1
                            if outcome == "crash" and len(examples) < max(show, 50):
                                examples.append(f"{entry} {'+'.join(mutations)}: {detail}")
                        done += 1
                        if done % 1000 == 0:
                            print(f"{done} cases, {time.monotonic() - started:.0f} s", file=sys.stderr,
                                  flush=True)
                        assign(slot)
                        continue
                if kind == "died" or time.monotonic() - slot["since"] > timeout:
                    entry = slot["entry"] or "view"
                    counts[entry]["runs"] += 1
                    if kind == "died":
                        counts[entry]["crashes"] += 1
                        examples.append(f"{entry} case {slot['case']}: worker process died")
                    else:
                        counts[entry]["hangs"] += 1
                        examples.append(f"{entry} case {slot['case']}: over {timeout:g} s")
                    slot["process"].kill()
                    slot["process"].join(5)
                    shutil.rmtree(slot["folder"], ignore_errors=True)
                    fresh = pool._spawn(slot["index"])
                    pool.slots[slot["index"]] = fresh
                    done += 1
                    assign(fresh)
        pool.close()
    for line in examples[:show]:
        print(line, file=sys.stderr)
    for c in counts.values():
        c["seconds"] = round(c["seconds"], 1)
    return {"cases": cases, "seed": seed, "workers": workers, "timeout_s": timeout,
            "seconds": round(time.monotonic() - started, 1), "entry": counts,
            "crashes": sum(c["crashes"] for c in counts.values()),
            "hangs": sum(c["hangs"] for c in counts.values()), "harness_errors": harness_errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per entry point per case")
    parser.add_argument("--show", type=int, default=10, help="crash examples printed on stderr")
    parser.add_argument("--max-seconds", type=float, help="start no case after this long (the JSON line "
                                                          "gives the cases actually run)")
    args = parser.parse_args(argv)
    result = run(args.cases, args.seed, args.workers, args.timeout, args.show, args.max_seconds)
    print(json.dumps(result))
    return 0 if result["crashes"] == 0 and result["hangs"] == 0 and result["harness_errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
