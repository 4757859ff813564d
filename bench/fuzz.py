"""Fuzz every live-tool parser with generated bad input; prints ONE JSON line of counts.

    python bench/fuzz.py                      # 10,000 cases per parser, plus bench/fuzz_profiles.py
    python bench/fuzz.py --cases 500 --profile-cases 0     # a quick run, live tools only
    python bench/fuzz.py --seed 7 --show 5    # another sequence; print 5 crash examples on stderr

Parsers, each fed IN-PROCESS through the functions the tools call:

* ``stream``  -- neuron-top's stream parser and renderer: 1-3 lines through ``MonitorSource``, then
  the frame drawn by ``frame_text`` (the ``--once`` path) and encoded as UTF-8, as written to a terminal;
* ``prometheus`` -- ``Exporter.process_line`` then a scrape (``generate_latest``);
* ``config``  -- ``parse_config`` on a mutated document, or ``load_config`` on a mutated file;
* ``sysfs``   -- ``read_devices`` and ``inventory.from_sysfs`` on a one-device tree with one to three
  hostile nodes (huge or negative numbers, binary, 1 MiB files, FIFOs, sockets, links to devices
  and loops, directories where files belong, absurd device or core directories).

Inputs are the documented report (sys-tools.md §1.11) and config (§1.3) with one to four mutations:
a value somewhere replaced by NaN, ±Inf, ``1e400``, integers of 5,000 digits or beyond int64, wrong
types, lone surrogates and control characters, deep nesting, long strings, counts such as 10^6
devices; keys deleted; lines truncated, bit-flipped or nested 100,000 deep.

A **crash** is any exception escaping (for configs: anything but the one-line ``ConfigError``); a
**hang** is a case still running after ``--timeout`` seconds (SIGALRM interrupts it). When
``bench/fuzz_profiles.py`` exists it runs alongside (a subprocess) and its counts join the line.

Output: ``{"cases": N, "seconds": T, "parsers": {"stream": {"cases", "crashes", "hangs", "slowest_s"},
...}, "crashes": C, "hangs": H}``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# the one bench script that uses a test fixture (tests/fixtures/sysfs.py, the fake sysfs tree to mutate):
# the repository on the path for ``tests.fixtures`` (bench/README.md)
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from collectors import inventory, sysfs  # noqa: E402
from collectors.monitor_config import ConfigError, load_config, parse_config  # noqa: E402
from collectors.prometheus import Exporter  # noqa: E402
from explorer.top.monitor_source import MonitorSource  # noqa: E402
from explorer.top.text_frame import frame_text  # noqa: E402

REPORT_LINE = (REPO / "tests" / "fixtures" / "data" / "top_monitor_trn1.jsonl").read_text().splitlines()[0]
CONFIG = {"period": "2s", "neuron_runtimes": [{"tag_filter": "^train-", "period": "1s", "metrics": [
    {"type": "neuroncore_counters"}, {"type": "execution_stats"}, {"type": "memory_used", "period": "5s"}]}],
    "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info", "period": "10s"},
                       {"type": "neuron_hw_counters"}]}

# placeholders replaced in the serialised text by what json.dumps cannot write
RAW = {"@@1e400@@": "1e400", "@@-1e400@@": "-1e400", "@@BIGINT@@": "9" * 5000,
       "@@DEEP@@": "[" * 3000 + "]" * 3000}


class Hang(Exception):
    """A case ran past its time limit."""


def hostile_value(rng: random.Random) -> Any:
    choices: list[Callable[[], Any]] = [
        lambda: math.nan, lambda: math.inf, lambda: -math.inf, lambda: "@@1e400@@", lambda: "@@-1e400@@",
        lambda: "@@BIGINT@@", lambda: "@@DEEP@@", lambda: 2**63, lambda: 2**64 + 1,
        lambda: -(2**63) - 1,
        lambda: -1, lambda: 0, lambda: 10**6, lambda: 10**9, lambda: 10**12, lambda: 1e300, lambda: 0.5,
        lambda: True, lambda: None, lambda: "", lambda: "x", lambda: "12", lambda: "\ud800",
        lambda: "\udfff\x1b[2J",
        lambda: "\x00\x07\x9b", lambda: "é" * 300, lambda: "a" * rng.choice((256, 10_000, 200_000)),
        lambda: [], lambda: {}, lambda: [1, 2, 3], lambda: {"a": {"b": None}}, lambda: [[[[[]]]]],
        lambda: {str(i): {} for i in range(rng.choice((10, 5000)))},
        lambda: list(range(rng.choice((10, 5000)))),
    ]
    return rng.choice(choices)()


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:8]):
            out += _paths(value, (*prefix, i))
    return out


def _set(doc: Any, path: tuple, value: Any, delete: bool = False) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    return doc


def mutate_doc(doc: Any, rng: random.Random, count: int) -> str:
    """The document with ``count`` mutations, serialised (placeholders expanded)."""
    doc = copy.deepcopy(doc)
    for _ in range(count):
        path = rng.choice(_paths(doc))
        roll = rng.random()
        if roll < 0.15 and path:
            doc = _set(doc, path, None, delete=True)
        elif roll < 0.25 and path and isinstance(path[-1], str):  # rename a key to something odd
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict) and path[-1] in parent:
                parent[rng.choice(("\ud800", "99999999999999999999", "-1", "", "1e9"))] = parent.pop(path[-1])
        else:
            doc = _set(doc, path, hostile_value(rng))
    text = json.dumps(doc)
    for key, raw in RAW.items():
        text = text.replace(f'"{key}"', raw)
    return text


def mutate_text(text: str, rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.3:
        return text[: rng.randrange(len(text) + 1)]
    if roll < 0.5:
        chars = list(text)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(chars))
            chars[i] = chr(ord(chars[i]) ^ (1 << rng.randrange(7)))
        return "".join(chars)
    if roll < 0.65:
        return rng.choice(("[", "{\"a\":", "{\"neuron_runtime_data\":[")) + "[" * rng.choice((1000, 100_000))
    if roll < 0.75:
        return json.dumps({"neuron_runtime_data": [{}] * rng.choice((5000, 200_000))})
    if roll < 0.85:
        return text.replace("48213", "9" * rng.choice((19, 400, 5000)), 1)
    return text + "\x00" + "\ud800" * rng.randint(1, 3)


def stream_case(rng: random.Random) -> None:
    report = json.loads(REPORT_LINE)
    lines = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.65:
            lines.append(mutate_doc(report, rng, rng.randint(1, 4)))
        elif roll < 0.9:
            lines.append(mutate_text(REPORT_LINE, rng))
        else:
            lines.append(REPORT_LINE)
    text = "".join(line.replace("\n", " ") + "\n" for line in lines)
    source = MonitorSource("fuzz.jsonl", io.StringIO(text), clock=lambda: 1_800_000_000.0)
    frame = source.poll()
    if frame is not None:
        frame_text(frame, width=rng.choice((40, 80, 120, 250)), version="0").encode("utf-8")


_EXPORTER: list[Any] = [None, 0]


def prometheus_case(rng: random.Random) -> None:
    if _EXPORTER[0] is None or _EXPORTER[1] >= 50:  # one exporter sees 50 cases, as a long-running one would
        _EXPORTER[:] = [Exporter(CollectorRegistry(), err=io.StringIO()), 0]
    exporter = _EXPORTER[0]
    _EXPORTER[1] += 1
    exporter.err.seek(0)
    exporter.err.truncate()
    report = json.loads(REPORT_LINE)
    for _ in range(rng.randint(1, 3)):
        mutated = rng.random() < 0.7
        line = mutate_doc(report, rng, rng.randint(1, 4)) if mutated else mutate_text(REPORT_LINE, rng)
        exporter.process_line(line.replace("\n", " "))
    generate_latest(exporter.registry).decode("utf-8")  # the scrape: must always answer


def config_case(rng: random.Random, workdir: Path) -> None:
    if rng.random() < 0.8:
        text = mutate_doc(CONFIG, rng, rng.randint(1, 3))
    else:
        text = mutate_text(json.dumps(CONFIG), rng)
    if rng.random() < 0.2:
        for value in ('"(a+)+$"', '"(a|aa)*b"', '"' + "a" * 2_000_000 + '"',
                      '"' + "(" * 3000 + ")" * 3000 + '"'):
            if rng.random() < 0.3:
                text = text.replace('"^train-"', value)
    try:
        if rng.random() < 0.7:
            parse_config(json.loads(text), "fuzz.conf")
        else:
            path = workdir / "fuzz.conf"
            path.write_text(text, errors="surrogatepass")
            load_config(path)
    except ConfigError as exc:
        if "\n" in str(exc):
            raise AssertionError("a ConfigError of more than one line") from None
    except (ValueError, RecursionError):  # the harness's own json.loads of a broken text: not a finding
        if "parse_config" in traceback.format_exc(limit=-1):
            raise


SYSFS_NODES = ("core_count", "connected_devices", "info/architecture/arch_type", "info/serial_number",
               "stats/hardware/mem_ecc_corrected", "stats/hardware/sram_ecc_uncorrected",
               "stats/memory_usage/host_mem/tensors", "stats/power/utilization",
               "neuron_core0/stats/memory_usage/device_mem/tensors",
               "neuron_core0/stats/status/exec_bad_input",
               "neuron_core0/stats/other_info/flop_count", "neuron_core1/stats/other_info/nc_time_in_use")


def _hostile_node(path: Path, rng: random.Random, workdir: Path) -> None:
    if path.is_dir() and rng.random() < 0.5:
        path = path / "total"
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    roll = rng.random()
    if roll < 0.12:
        os.mkfifo(path)
    elif roll < 0.17:
        with socket.socket(socket.AF_UNIX) as sock, contextlib.suppress(OSError):
            sock.bind(str(path))  # a path too long for a socket address: a FIFO below instead
            return
        os.mkfifo(path)
    elif roll < 0.25:
        path.symlink_to(rng.choice(("/dev/zero", "/dev/urandom", str(path), "/proc/self/fd/0")))
    elif roll < 0.3:
        path.mkdir()
    elif roll < 0.35:
        path.write_bytes(os.urandom(rng.choice((16, 4096))))
    elif roll < 0.4:
        path.write_text("7" * (1 << 20))
    else:
        path.write_text(rng.choice((str(10**12), "-1", "1e3", "nan", "9" * 5000, "18446744073709551616", "",
                                    "\ud800".encode("utf-8", "surrogatepass").decode("latin-1"), "0x10",
                                    " 5 6 7", ",".join(["999999"] * 1000), "1,2,3,4,5", "a,b,c,d,e")),
                        encoding="latin-1")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def sysfs_case(rng: random.Random, workdir: Path, template: Path) -> None:
    """One to three hostile nodes in the tree, read, then those nodes restored from the template
    (a whole copy per case would cost more than the read)."""
    tree = workdir / "tree"
    if not tree.exists():
        shutil.copytree(template, tree, symlinks=True)
    device = tree / "neuron0"
    touched: list[str] = []
    try:
        for _ in range(rng.randint(1, 3)):
            roll = rng.random()
            if roll < 0.1:
                name = f"neuron{rng.choice((10**9, 127, 128, 4096))}"
                (tree / name).mkdir(exist_ok=True)
                touched.append(name)
            elif roll < 0.15:
                name = f"neuron_core{rng.choice((10**6, 63, 64))}"
                (device / name).mkdir(exist_ok=True)
                touched.append(f"neuron0/{name}")
            else:
                node = rng.choice(SYSFS_NODES)
                touched.append(f"neuron0/{node}")
                _hostile_node(device / node, rng, workdir)
        devices = sysfs.read_devices(tree)
        if devices and rng.random() < 0.2:
            inventory.from_sysfs(tree, dmi=workdir / "no-dmi")
    finally:
        for name in touched:
            _remove(tree / name)
            original = template / name
            if original.is_dir():
                shutil.copytree(original, tree / name, symlinks=True)
            elif original.exists():
                shutil.copy2(original, tree / name)


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang


def run_parser(name: str, case: Callable[[random.Random], None], cases: int, seed: int, timeout: float,
               show: int) -> dict[str, Any]:
    crashes = hangs = 0
    slowest = 0.0
    examples = 0
    for i in range(cases):
        rng = random.Random(f"{seed}-{name}-{i}")
        started = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            case(rng)
        except Hang:
            hangs += 1
            if examples < show:
                examples += 1
                print(f"[{name} #{i}] hang over {timeout} s", file=sys.stderr)
        except Exception as exc:  # every escaping exception is a finding
            crashes += 1
            if examples < show:
                examples += 1
                print(f"[{name} #{i}] {type(exc).__name__}: {str(exc)[:160]}\n"
                      + "".join(traceback.format_exc(limit=-3).splitlines(True)[-4:]), file=sys.stderr)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.perf_counter() - started)
    return {"cases": cases, "crashes": crashes, "hangs": hangs, "slowest_s": round(slowest, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per parser")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case before it is a hang")
    parser.add_argument("--show", type=int, default=3, help="crash examples per parser on stderr")
    parser.add_argument("--profile-cases", type=int, default=10_000,
                        help="cases for bench/fuzz_profiles.py, run alongside (0: skip it)")
    parser.add_argument("--only", choices=("stream", "prometheus", "config", "sysfs"), action="append")
    args = parser.parse_args(argv)
    started = time.time()
    signal.signal(signal.SIGALRM, _alarm)
    profiles_script = REPO / "bench" / "fuzz_profiles.py"
    profiles: subprocess.Popen | None = None
    if args.profile_cases > 0 and profiles_script.exists():
        profiles = subprocess.Popen([sys.executable, str(profiles_script), "--cases", str(args.profile_cases),
                                     "--seed", str(args.seed), "--workers", "1"],
                                    stdout=subprocess.PIPE, text=True, cwd=REPO)
    result: dict[str, Any] = {"cases": args.cases, "seed": args.seed, "parsers": {}}
    with tempfile.TemporaryDirectory(prefix="neuronscope-fuzz-") as tmp:
        workdir = Path(tmp)
        from tests.fixtures.sysfs import make_sysfs

        template = make_sysfs(workdir / "template", devices=1)
        parsers: dict[str, Callable[[random.Random], None]] = {
            "stream": stream_case,
            "prometheus": prometheus_case,
            "config": lambda rng: config_case(rng, workdir),
            "sysfs": lambda rng: sysfs_case(rng, workdir, template),
        }
        for name, case in parsers.items():
            if args.only and name not in args.only:
                continue
            result["parsers"][name] = run_parser(name, case, args.cases, args.seed, args.timeout, args.show)
    if profiles is not None:
        out, _ = profiles.communicate()
        try:
            counts = json.loads(out.strip().splitlines()[-1])
            result["parsers"]["profiles"] = {"cases": counts.get("cases"), "crashes": counts.get("crashes"),
                                             "hangs": counts.get("hangs"), "entry": counts.get("entry")}
        except (ValueError, IndexError):
            result["parsers"]["profiles"] = {"cases": args.profile_cases, "crashes": None, "hangs": None,
                                             "error": f"bench/fuzz_profiles.py exited {profiles.returncode}"}
    result["crashes"] = sum(p.get("crashes") or 0 for p in result["parsers"].values())
    result["hangs"] = sum(p.get("hangs") or 0 for p in result["parsers"].values())
    result["seconds"] = round(time.time() - started, 1)
    print(json.dumps(result))
    return 0 if result["crashes"] == 0 and result["hangs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
