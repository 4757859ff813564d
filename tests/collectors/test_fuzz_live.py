"""Generated bad input for every live-tool parser (issue 14), a few seconds per parser per run.

Each property feeds hypothesis-generated mutations of the documented report or config through the
functions the tools call and asserts only what must always hold: nothing escapes but the documented
one-line error, nothing bad reaches what is drawn or exported. ``bench/fuzz.py`` runs the long
version (10,000 cases per parser)."""

from __future__ import annotations

import copy
import io
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from collectors import sysfs
from collectors.monitor_config import ConfigError, parse_config
from collectors.prometheus import Exporter
from explorer.top.monitor_source import MonitorSource
from explorer.top.text_frame import frame_text
from tests.fixtures.samples import DATA
from tests.fixtures.sysfs import make_sysfs

REPO = Path(__file__).resolve().parents[2]
STREAM = DATA / "top_monitor_trn1.jsonl"
REPORT = json.loads(STREAM.read_text().splitlines()[0])
CONFIG = {"period": "2s", "neuron_runtimes": [{"tag_filter": "^train-", "metrics": [
    {"type": "neuroncore_counters"}, {"type": "memory_used", "period": "5s"}]}],
    "system_metrics": [{"type": "vcpu_usage"}, {"type": "neuron_hw_counters"}]}
BUDGET = settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

scalars = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 2**63, 2**64 + 1, -(2**63) - 1, -1, 0, 10**6, 10**9,
                     10**12, 1e300, True, None, "", "\ud800", "\x1b[2J\x07", "12", "9" * 300]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


def _paths(node, prefix=()):
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node[:4]):
            out += _paths(value, (*prefix, i))
    return out


@st.composite
def mutated(draw, base):
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            doc = draw(values)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = draw(values)
    text = json.dumps(doc)
    special = draw(st.sampled_from(["", "1e400", "9" * 5000, "[" * 5000]))
    if special and draw(st.booleans()):
        text = text.replace("48213", special, 1) if "48213" in text else special + text
    return text


@BUDGET
@given(st.lists(mutated(REPORT), min_size=1, max_size=3), st.sampled_from([40, 120]))
def test_stream_parser_and_renderer_take_anything(lines, width):
    stream = io.StringIO("".join(line + "\n" for line in lines))
    source = MonitorSource("fuzz.jsonl", stream, clock=lambda: 1.0)
    frame = source.poll()
    text = frame_text(frame, width=width, version="0")
    text.encode("utf-8")  # what --once writes: no lone surrogate survives
    assert all(e.startswith("line ") for e in frame.status.errors)
    for process in frame.processes:
        for core in (process.cores or {}).values():
            assert math.isfinite(core.utilization) and math.isfinite(core.flops)
    assert frame.hardware.device_count <= 128 and frame.hardware.cores_per_device <= 64


@BUDGET
@given(st.lists(mutated(REPORT), min_size=1, max_size=3))
def test_exporter_takes_anything_and_every_scrape_answers(lines):
    exporter = Exporter(CollectorRegistry(), err=io.StringIO())
    for line in lines:
        exporter.process_line(line)
        scraped = generate_latest(exporter.registry).decode("utf-8")
        for row in scraped.splitlines():
            if row and not row.startswith("#"):
                assert row.rsplit(" ", 1)[1] not in ("NaN", "+Inf", "-Inf"), row


@BUDGET
@given(mutated(CONFIG))
def test_monitor_config_is_checked_or_refused_in_one_line(text):
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return  # not JSON: load_config's business, covered in test_monitor_config
    try:
        config = parse_config(data, "fuzz.conf")
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    periods = [g.period_s for r in config.runtimes for g in r.groups] + [g.period_s for g in config.system]
    assert periods and all(0.01 <= p <= 86400 for p in periods)


NODES = ["core_count", "connected_devices", "info/architecture/arch_type", "stats/hardware/mem_ecc_corrected",
         "neuron_core0/stats/other_info/flop_count", "neuron_core1/stats/memory_usage/device_mem/tensors"]


@pytest.fixture(scope="module")
def sysfs_template(tmp_path_factory):
    return make_sysfs(tmp_path_factory.mktemp("sysfs"), devices=1)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(NODES),
                          st.one_of(st.sampled_from(["fifo", "dir", "link-loop", "dev-zero"]),
                                    st.text(max_size=30), st.binary(max_size=64).map(lambda b: b.hex()),
                                    st.integers().map(str))), min_size=1, max_size=3))
def test_sysfs_reader_takes_any_tree(sysfs_template, tmp_path_factory, nodes):
    tree = tmp_path_factory.mktemp("tree") / "t"
    shutil.copytree(sysfs_template, tree, symlinks=True)
    for name, content in nodes:
        path = tree / "neuron0" / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "fifo":
            os.mkfifo(path)
        elif content == "dir":
            path.mkdir()
        elif content == "link-loop":
            path.symlink_to(path)
        elif content == "dev-zero":
            path.symlink_to("/dev/zero")
        else:
            path.write_text(content, errors="surrogatepass")
    for device in sysfs.read_devices(tree):
        assert 0 <= device.core_count <= 64
        assert all(0 <= v < 2**64 for v in device.hw_counters.values())
    shutil.rmtree(tree)
