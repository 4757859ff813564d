"""neuron-top's data layer without a screen: formats, report parsing, "all" rules, the memory tree
and its keys, both sources (recorded live state, monitor streams with bad lines), ``--once`` text."""

from __future__ import annotations

import io
import json

import pytest

from explorer.top import fmt, memtree, render
from explorer.top.aggregate import combine, mean_utilization, tab_data, tabs
from explorer.top.history import History
from explorer.top.monitor_source import MonitorSource
from explorer.top.report import parse_process, parse_system
from explorer.top.snapshots import (
    EXITED,
    STALE,
    CoreUse,
    Frame,
    Hardware,
    ProcessSnapshot,
    SourceStatus,
    SystemSnapshot,
)
from explorer.top.text_frame import frame_text
from tests.fixtures.top_frames import (
    MONITOR_STREAM,
    VERSION,
    idle_frame,
    live_frame,
    live_source,
    monitor_frame,
    recorded_samples,
)

# -- number formats (sys-tools.md §3.5) ---------------------------------------------------------


def test_percent_format():
    assert fmt.percent(0.72) == " 0.72%"
    assert fmt.percent(56.81) == "56.81%"
    assert fmt.percent(99.99) == "99.99%"
    assert len(fmt.percent(99.995)) == 6
    assert fmt.percent(99.996) == "  100%"
    assert fmt.percent(100) == "  100%"


def test_size_format():
    # one convention for every view (formats.units): binary sizes spelled KiB/MiB/GiB
    assert fmt.size(0) == "0B"
    assert fmt.size(256 * 1024) == "256.0KiB"
    assert fmt.size(int(17.5 * 2**30)) == "17.5GiB"
    assert fmt.size(2**60) == "1.0EiB"
    assert fmt.size(1024 * 1024 - 1) == "1.0MiB"
    assert fmt.size(None) == "-"
    assert fmt.rate(12.3e9) == "12.3GB/s"  # throughput in decimal GB/s


def test_tflops_and_other_formats():
    assert f"[{fmt.tflops(10.004e12, 7)}]" == "[ 10.004TF]"
    assert fmt.tflops(318.278e12) == "318.278TF"
    assert fmt.core_ranges([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
    assert fmt.core_ranges([]) == "-"
    assert fmt.age(42) == "42s" and fmt.age(187) == "3m07s" and fmt.age(7500) == "2h05m"
    assert fmt.sparkline([0, 50, 100], 5, top=100) == "  ▁▅█"
    assert fmt.fit("abcdef", 4) == "abc…" and fmt.tail("abcdef", 3) == "def"


# -- reports and the "all" rules ----------------------------------------------------------------


def test_all_tab_sums_and_caps_utilisation():
    a = ProcessSnapshot(1, "a", cores={0: CoreUse(0, 70.0, 1e12), 1: CoreUse(1, 10.0, 0.0)},
                        host_memory={"tensors": 1}, core_memory={0: {"tensors": 5}}, vcpu_user=1.0,
                        vcpu_system=0.5)
    b = ProcessSnapshot(2, "b", cores={0: CoreUse(0, 60.0, 2e12)}, host_memory={"tensors": 2},
                        core_memory={0: {"tensors": 7}}, vcpu_user=2.0, vcpu_system=0.25)
    data = combine([a, b])
    assert data.utilization == {0: 100.0, 1: 10.0}  # summed, capped at 100
    assert data.flops[0] == 3e12
    assert data.host_memory["tensors"] == 3 and data.core_memory[0]["tensors"] == 12
    assert (data.vcpu_user, data.vcpu_system) == (3.0, 0.75)


def _one_core_frame(kind: str) -> Frame:
    """Two cores; one process lists core 0 at 9.30 %, core 1 is absent."""
    proc = ProcessSnapshot(1, "a", cores={0: CoreUse(0, 9.30, 2e12)})
    return Frame(1, 0.0, Hardware("i-1", "trn1.2xlarge", "v2", 1, 2, 32 << 30, simulated=kind == "live"),
                 SystemSnapshot(), (proc,), SourceStatus(kind, "test"))


def test_header_average_is_over_present_cores_only():
    """9.30 % and ``--`` average to 9.30 %, not 4.65 % (issue 12 §2)."""
    frame = _one_core_frame("monitor")
    data = tab_data(frame, None)
    assert mean_utilization(data.utilization) == pytest.approx(9.30) and mean_utilization({}) is None
    header = render.util_header(frame, data, False)
    assert "Avg:  9.30%, 1 of 2 cores" in header and "4.65" not in header
    assert "Avg: 2.000TF | Total: 2.000TF, 1 of 2 cores" in render.util_header(frame, data, True)
    assert "(Avg:  9.30%)" in render.util_header(frame, data, False, short=True)


def test_live_utilisation_says_it_depends_on_the_host():
    live, stream = _one_core_frame("live"), _one_core_frame("monitor")
    assert render.util_notes(live) and not render.util_notes(stream)
    for width in (80, 100, 160):  # the caveat fits beside the header at every usual width
        data = (render.util_header(live, tab_data(live, None), False),
                render.util_header(live, tab_data(live, None), False, short=True), render.util_notes(live))
        line = render.util_section(data, width).plain
        assert len(line) == width and "Avg:  9.30%" in line and "sim" in line and "host" in line
    assert "simulated: " in frame_text(live, width=120, version=VERSION)
    assert "simulated: " not in frame_text(stream, width=120, version=VERSION)


def test_monitor_example_matches_the_documented_screen():
    frame = monitor_frame()
    assert [t.label for t in tabs(frame)] == ["all", "llama-ft", "bert_base_b8_s128"]  # model, not pid
    data = tab_data(frame, None)
    assert sorted(data.utilization) == [0, 1, 2, 3, 6]  # cores 4, 5, 7.. absent, not 0
    assert data.utilization[3] == 0.0
    assert fmt.size(sum(data.device_memory.values())) == "39.8GiB"  # binary units, spelled as such
    rows = memtree.build_rows(frame.hardware, data)
    by_label = {(r.key[0], r.key[1]): r for r in rows if r.key[0] in ("nd", "nc")}
    assert fmt.size(by_label["nd", 0].device_bytes) == "19.8GiB"
    assert fmt.size(by_label["nd", 0].host_bytes) == "40.0KiB"
    assert fmt.size(by_label["nd", 3].device_bytes) == "515.0MiB"
    # parent = sum of children, at every level
    for row in rows:
        children = [r for r in rows if r.parent == row.key]
        if children:
            assert row.device_bytes == sum(c.device_bytes for c in children)
    # pid 48990's vcpu group failed: flagged, its other groups still count
    p = frame.process(48990)
    assert "neuron_runtime_vcpu_usage" in p.group_errors and p.vcpu_user is None and p.cores


def test_entry_errors_and_malformed_groups():
    hw = monitor_frame().hardware
    bad = parse_process({"pid": 7, "neuron_runtime_tag": "x", "error": "runtime gone", "report": {}}, hw)
    assert bad.state == "error"
    odd = parse_process({"pid": 8, "error": "", "report": {
        "neuroncore_counters": {"period": 1, "error": "",
                                "neuroncores_in_use": {"0": {"effective_flops": 5}}},
        "memory_used": {"period": 1, "error": "", "neuron_runtime_used_bytes": 12}}}, hw)
    assert odd.cores[0].flops == 5 and "memory_used" in odd.group_errors
    assert parse_system({"vcpu_usage": {"average_usage": "nope", "error": ""}}).errors


def test_monitor_stream_bad_lines_keep_the_last_report():
    good = MONITOR_STREAM.read_text().splitlines()[0]
    stream = io.StringIO(good + "\n{not json\n[1, 2]\n")
    source = MonitorSource("stream.jsonl", stream, clock=lambda: 100.0)
    frame = source.poll()
    assert frame.status.malformed == 2 and frame.status.reports == 1
    assert "line 2: not JSON" in frame.status.errors[0] and "line 3: not a report" in frame.status.errors[1]
    assert len(frame.active) == 2  # still showing the good report
    assert source.poll() is None  # nothing new: no frame, no redraw


def test_monitor_pipe_end_and_partial_groups(tmp_path):
    first = json.loads(MONITOR_STREAM.read_text().splitlines()[0])
    second = json.loads(json.dumps(first))
    for entry in second["neuron_runtime_data"]:
        entry["report"].pop("memory_used")  # a group with a longer period: not in this line
    second["neuron_runtime_data"] = second["neuron_runtime_data"][:1]  # pid 48990 exited
    r, w = __import__("os").pipe()
    with open(w, "w") as out:
        out.write(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    source = MonitorSource("-", open(r), clock=lambda: 5.0)  # noqa: SIM115 -- the source owns it
    frame = None
    for _ in range(200):
        frame = source.poll() or frame
        if source.ended:
            break
        __import__("time").sleep(0.01)
    assert frame.status.ended and "ended after 2 reports" in frame.status.message
    assert frame.process(48213).core_memory  # memory_used kept from the line before
    assert frame.process(48990).state == EXITED and [t.pid for t in tabs(frame)] == [None, 48213]


# -- live state --------------------------------------------------------------------------------


def test_live_source_matches_the_recording():
    frame = live_frame()
    samples = recorded_samples()
    assert [p.pid for p in frame.active] == [s.pid for s in samples[-1]]
    data = tab_data(frame, None)
    assert sorted(data.utilization) == [0, 1, 4, 5, 6, 7]
    assert set(data.engine_busy[0]) == {"Tensor", "Vector", "Scalar", "GpSimd", "DMA"}
    assert data.hbm_bytes_per_s[0] > 0 and data.link_bytes_per_s["neuronlink"] > 0
    assert frame.history.has_hbm and len(frame.history.cores[None][0]) == 3
    llama = frame.process(4110)
    assert llama.held_cores == (4, 5, 6, 7) and llama.user == "ubuntu" and llama.started_exact


def test_live_source_flags_stale_and_exited():
    samples = recorded_samples()
    stale = [s.__class__(**{**s.__dict__, "stale": True}) for s in samples[1]]
    source = live_source([samples[0], stale, samples[2][:1]])
    source.poll()
    assert {p.state for p in source.poll().processes} == {STALE}
    frame = source.poll()
    gone = frame.process(samples[0][1].pid)
    assert gone.state == EXITED and len(frame.active) == 1


def test_no_activity_is_not_zero_percent():
    frame = idle_frame()
    assert not frame.active and "no process is publishing" in frame.status.message
    text = frame_text(frame, width=100, version=VERSION)
    assert "(no Neuron activity)" in text and "0.00%" not in text.split("== vCPU")[0]
    assert "[  --  ]" in text


def test_history_is_bounded_and_forgets_exited_processes():
    history = History(samples=4)
    proc = ProcessSnapshot(1, "a", cores={0: CoreUse(0, 50.0, 0.0)})
    for _ in range(10):
        view = history.record([proc])
    assert view.cores[None][0] == (50.0,) * 4 and 1 in view.cores
    assert 1 not in history.record([]).cores


# -- tree navigation (sys-tools.md §3.3) -----------------------------------------------------------


@pytest.fixture()
def tree():
    frame = monitor_frame()
    return memtree.build_rows(frame.hardware, tab_data(frame, None))


def test_tree_up_down_wrap(tree):
    state = memtree.settle(tree, memtree.TreeState())
    assert state.selected == ("nd", 0)
    visible = memtree.visible_rows(tree, state)
    assert memtree.move(tree, state, -1).selected == visible[-1].key  # wraps
    assert memtree.move(tree, state, 1).selected == visible[1].key


def test_tree_left_right_enter_x(tree):
    state = memtree.settle(tree, memtree.TreeState())
    right = memtree.right(tree, state)  # already open: first child
    assert right.selected == ("nc", 0)
    model = memtree.move(tree, right, 1)
    assert model.selected[0] == "model" and not memtree.is_expanded(model, model.selected)
    opened = memtree.right(tree, model)
    assert memtree.is_expanded(opened, opened.selected)
    closed = memtree.left(tree, opened)
    assert not memtree.is_expanded(closed, closed.selected)
    assert memtree.left(tree, closed).selected == ("nc", 0)  # collapsed: go to the parent
    toggled = memtree.toggle(tree, closed)
    assert memtree.is_expanded(toggled, toggled.selected)
    everything = memtree.toggle_all(tree, closed)
    assert len(memtree.visible_rows(tree, everything)) == len(tree)
    collapsed = memtree.toggle_all(tree, everything)
    assert collapsed.selected == ("nd", 0)  # moved to its device
    assert all(r.depth == 0 for r in memtree.visible_rows(tree, collapsed))


# -- process names, order, filter, stopped processes -------------------------------------------


@pytest.mark.parametrize("command, name, args", [
    ("/work/main/.venv/bin/python my_script.py --steps 3", "my_script.py", "--steps 3"),
    ("/usr/bin/python3.12 -u -X dev /home/me/train.py", "train.py", ""),
    ("/work/main/.venv/bin/python /work/main/.venv/bin/neuron-profile run -w bert-layer",
     "neuron-profile run", "-w bert-layer"),
    ("python -m explorer.profile_cli run --workload mlp", "explorer.profile_cli", "run --workload mlp"),
    ("python -c import neuroncore", "python -c", "import neuroncore"),
    ("/opt/bin/serve --port 80", "serve", "--port 80"),
])
def test_program_is_the_script_not_the_interpreter(command, name, args):
    from explorer.top.names import Program, program
    assert program(command) == Program(name, args)
    assert program("") is None and program(None) is None


def test_commands_and_tabs_name_the_script_and_model():
    """A process without NEURON_PROCESS_TAG is tagged with its pid: its tab and COMMAND show the script
    and its model instead of the pid and a cut interpreter path (issue 12 §3)."""
    from dataclasses import replace

    from explorer.top import names
    frame = live_frame()
    bert = frame.process(4100)
    mine = replace(bert, tag=str(bert.pid), command="/work/main/.venv/bin/python /home/me/my_script.py --n 3")
    frame = replace(frame, processes=(mine, *frame.processes[1:]))
    assert [t.label for t in tabs(frame)] == ["all", "my_script.py (bert_layer)", "llama-tp4"]
    assert names.command_text(mine) == "my_script.py --n 3"
    row = render.process_row(mine, frame.taken_at, 100, False).plain
    assert "my_script.py --n 3" in row and "/work/main" not in row and "4100" in row
    assert names.command_text(bert).startswith("[bert-serve] explorer.profile_cli run")
    # a neuron-monitor stream has no command line: the tag, else the model, never a bare pid
    assert [t.label for t in tabs(monitor_frame())] == ["all", "llama-ft", "bert_base_b8_s128"]
    assert names.model_name("/tmp/x/0.1.0+13fdce652-bert_layer.neff") == "bert_layer"


def _table_frame():
    from dataclasses import replace
    frame = live_frame()
    a, b = frame.processes
    c = replace(a, pid=4200, tag="4200", command="python zeta.py", user=None, rss_bytes=None,
                cores={9: CoreUse(9, 50.0, 0.0)}, core_memory={9: {"tensors": 1}}, state=EXITED, models=())
    d = replace(b, pid=4050, tag="job", command="python alpha.py", cores={8: CoreUse(8, 90.0, 0.0)},
                core_memory={8: {"tensors": 1 << 40}}, models=())
    return replace(frame, processes=(a, b, c, d))


def test_process_table_sorts_like_htop():
    from explorer.top.proctable import SortKey, TableView, ordered
    frame = _table_frame()
    pids = lambda view: [p.pid for p in ordered(frame.processes, view, frame.taken_at)]  # noqa: E731
    assert pids(TableView()) == [4050, 4100, 4110, 4200]  # exited last whatever the order
    assert pids(TableView(SortKey.PID, reverse=True)) == [4110, 4100, 4050, 4200]
    assert pids(TableView(SortKey.NC))[0] == 4050  # quantities: largest first
    assert pids(TableView(SortKey.NC, reverse=True))[:1] != [4050]
    assert pids(TableView(SortKey.DEV_MEM))[0] == 4050
    assert pids(TableView(SortKey.COMMAND))[:1] == [4050]  # by what was run (alpha.py), not the tag
    view = TableView().cycle(1)
    assert view.sort == SortKey.USER and TableView().cycle(-1).sort == SortKey.STATE
    assert TableView(SortKey.AGE).cycle(1, (SortKey.PID, SortKey.NC)).sort == SortKey.PID  # hidden column
    assert TableView().by(SortKey.NC).by(SortKey.NC).reverse  # the same key twice inverts
    header = render.process_header(100, TableView(SortKey.DEV_MEM)).plain
    assert "DEV MEM▼" in header and "PID▲" not in header
    assert "PID▼" in render.process_header(100, TableView(reverse=True)).plain


def test_process_table_filter():
    from explorer.top.proctable import TableView, ordered
    frame = _table_frame()
    pids = lambda text: [p.pid for p in ordered(frame.processes, TableView(filter=text), 0.0)]  # noqa: E731
    assert pids("alpha") == [4050] and pids("LLAMA") == [4110] and pids("4100") == [4100]
    assert pids("bert_layer") == [4100]  # model names too
    assert pids("ubuntu llama") == [4110] and pids("nothing-like-it") == []
    text = render.processes(frame, 100, None, view=TableView(filter="nothing-like-it")).plain
    assert 'no process matches "nothing-like-it"' in text
    section = render.process_section(TableView(filter="alpha"), 1, 4)
    assert section == 'Processes: 1 of 4 match "alpha" (/ edits)'


def test_stopped_process_is_flagged_and_idle():
    """SIGSTOP: psutil says ``stopped``; the process keeps its cores and memory, its cores read 0 %
    (its publisher's last rates are not repeated), and the main screen says so (issue 12 §3)."""
    from explorer.top.snapshots import STOPPED
    source = live_source()
    source._status_of = lambda pid: "stopped" if pid == 4100 else "sleeping"
    frame = source.poll()
    stopped = frame.process(4100)
    assert stopped.state == STOPPED and stopped in frame.active
    assert stopped.cores and all(u.utilization == 0.0 and u.flops == 0.0 for u in stopped.cores.values())
    assert stopped.device_memory_bytes  # still holds its memory
    assert frame.process(4110).state != STOPPED
    assert render.process_state(stopped)[0] == "STOPPED"
    assert [t.label for t in tabs(frame)][1] == "bert-serve (stopped)"
    status = render.status_line(frame, 200).plain
    assert "stopped (SIGSTOP): pid 4100" in status and "SIGCONT" in status
    assert "STOPPED" in render.processes(frame, 100, None).plain


def test_process_status_sees_a_real_sigstop():
    import signal
    import subprocess
    import sys
    import time

    from explorer.top.live_source import process_status
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGSTOP)
        for _ in range(100):
            if process_status(child.pid) == "stopped":
                break
            time.sleep(0.05)
        assert process_status(child.pid) == "stopped"
        child.send_signal(signal.SIGCONT)
        for _ in range(100):
            if process_status(child.pid) != "stopped":
                break
            time.sleep(0.05)
        assert process_status(child.pid) in ("sleeping", "running")
    finally:
        child.kill()
        child.wait()
    assert process_status(child.pid) is None


# -- hostile streams (issue 14): nothing bad leaves the parser ----------------------------------


def _first_report() -> dict:
    return json.loads(MONITOR_STREAM.read_text().splitlines()[0])


def _mutated(change) -> str:
    report = _first_report()
    change(report)
    return json.dumps(report)


def _entry(report: dict) -> dict:
    return report["neuron_runtime_data"][0]


def _feed(*lines: str):
    """The frame of a stream of these lines, and its --once text encoded as the terminal would."""
    source = MonitorSource("hostile.jsonl", io.StringIO("".join(line + "\n" for line in lines)),
                           clock=lambda: 100.0)
    frame = source.poll()
    assert frame is not None
    frame_text(frame, width=120, version=VERSION).encode("utf-8")  # what --once writes
    return frame


def _util(report: dict, value) -> None:
    in_use = _entry(report)["report"]["neuroncore_counters"]["neuroncores_in_use"]
    in_use["0"]["neuroncore_utilization"] = value


def _host_mem(report: dict, value) -> None:
    _entry(report)["report"]["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]["host"][
        "tensors"] = value


HOSTILE_VALUES = {
    "nan utilisation": (lambda r: _util(r, float("nan")), "neuroncore_counters"),
    "inf utilisation": (lambda r: _util(r, float("inf")), "neuroncore_counters"),
    "inf host memory": (lambda r: _host_mem(r, float("inf")), "memory_used"),
    "-inf core memory": (lambda r: _entry(r)["report"]["memory_used"]["neuron_runtime_used_bytes"][
        "usage_breakdown"]["neuroncore_memory_usage"]["0"].__setitem__("tensors", float("-inf")),
        "memory_used"),
    "inf count": (lambda r: _entry(r)["report"]["execution_stats"]["execution_summary"].__setitem__(
        "completed", float("inf")), "execution_stats"),
    "nan latency": (lambda r: _entry(r)["report"]["execution_stats"]["latency_stats"]["total_latency"]
                    .__setitem__("p50", float("nan")), "execution_stats"),
    "huge core index": (lambda r: _entry(r)["report"]["neuroncore_counters"]["neuroncores_in_use"]
                        .__setitem__("999999999999", {"neuroncore_utilization": 5}), "neuroncore_counters"),
    "utilisation of the wrong type": (lambda r: _util(r, [1, 2]), "neuroncore_counters"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_VALUES))
def test_a_bad_number_is_its_groups_error_and_the_line_is_counted(name):
    change, group = HOSTILE_VALUES[name]
    frame = _feed(_mutated(change))
    process = frame.process(_first_report()["neuron_runtime_data"][0]["pid"])
    assert group in process.group_errors and process.group_errors[group].startswith("malformed")
    assert frame.status.malformed == 1 and frame.status.errors[-1].startswith("line 1: pid ")
    assert frame.status.reports == 1 and len(frame.active) == 2  # the rest of the line still counts


@pytest.mark.parametrize("pid", [float("inf"), float("nan"), 1e300, 10**40, -3, "48213", True])
def test_a_pid_that_is_not_a_process_id_makes_its_entry_an_error(pid):
    report = _first_report()
    text = json.dumps(report).replace('"pid": 48213', f'"pid": {json.dumps(pid)}', 1)
    if isinstance(pid, float) and pid == 1e300:
        text = text.replace("1e+300", "1e400")  # JSON's 1e400 is a float that overflows
    frame = _feed(text)
    assert frame.status.malformed == 1 and "not a process id" in frame.status.errors[-1]
    assert all(p.pid >= 0 or p.state == "error" for p in frame.processes)


@pytest.mark.parametrize("where, value", [("report", [1]), ("report", "x"), ("report", 5),
                                          ("system_data", [1]), ("system_data", "x")])
def test_report_or_system_data_of_the_wrong_type(where, value):
    report = _first_report()
    if where == "report":
        _entry(report)["report"] = value
    else:
        report["system_data"] = value
    frame = _feed(json.dumps(report))
    assert frame.status.reports == 1


def test_system_groups_with_nan_and_inf_keep_their_last_values():
    good = _first_report()
    bad = _mutated(lambda r: r["system_data"].update(
        vcpu_usage={"period": 1, "error": "", "average_usage": {"user": float("nan")}, "usage_data": {}},
        memory_info={"period": 1, "error": "", "memory_total_bytes": float("inf"), "memory_used_bytes": 1}))
    frame = _feed(json.dumps(good), bad)
    first = _feed(json.dumps(good)).system
    assert frame.system.vcpu_user == first.vcpu_user and frame.system.memory_total == first.memory_total
    assert any("vcpu_usage: malformed" in e for e in frame.system.errors)
    assert frame.status.malformed == 1 and "line 2:" in frame.status.errors[-1]


def test_lone_surrogates_and_control_characters_never_reach_the_screen():
    text = _mutated(lambda r: (_entry(r).__setitem__("neuron_runtime_tag", "\ud800\x1b[2Jtag\x07"),
                               _entry(r).__setitem__("pid", 77)))
    frame = _feed(text)
    tag = frame.process(77).tag
    assert tag == "??[2Jtag?" and tag.isprintable()


@pytest.mark.parametrize("line, message", [
    ("[" * 100_000, "nested too deeply"),
    ('{"neuron_runtime_data":' + "[" * 100_000, "nested too deeply"),
    ('{"neuron_runtime_data":[{"pid":' + "9" * 5000 + "}]}", "not JSON"),
], ids=["deep-list", "deep-in-report", "5000-digit-int"])
def test_deep_nesting_and_huge_integers_are_bad_lines(line, message):
    frame = _feed(line, MONITOR_STREAM.read_text().splitlines()[0])
    assert frame.status.malformed == 1 and frame.status.errors[0].startswith("line 1: ")
    assert message in frame.status.errors[0] and frame.status.reports == 1


@pytest.mark.parametrize("key, value", [
    ("neuron_device_count", 10**6), ("neuroncore_per_device_count", 10**9),
    ("neuron_device_count", float("nan")), ("neuron_device_count", -1),
    ("neuron_device_memory_size", float("inf"))])
def test_hardware_counts_beyond_any_instance_keep_the_last_value(key, value):
    good = json.dumps(_first_report())
    frame = _feed(good, _mutated(lambda r: r["neuron_hardware_info"].__setitem__(key, value)))
    before = _feed(good).hardware
    assert (frame.hardware.device_count, frame.hardware.cores_per_device) == (
        before.device_count, before.cores_per_device)
    assert key in frame.hardware.error and "line 2: neuron_hardware_info" in frame.status.errors[-1]


def test_an_over_long_line_is_skipped_without_holding_it(monkeypatch):
    import explorer.top.monitor_source as monitor_source

    good = MONITOR_STREAM.read_text().splitlines()[0]
    monkeypatch.setattr(monitor_source, "MAX_LINE_CHARS", len(good) + 10)
    long = '{"neuron_runtime_data":[],"x":"' + "a" * (3 * len(good)) + '"}'
    for pipe in (False, True):
        stream = io.StringIO(f"{long}\n{good}\n")
        if pipe:
            stream = _Unseekable(stream)
        source = MonitorSource("s", stream, clock=lambda: 1.0)
        frame = None
        for _ in range(500):
            frame = source.poll() or frame
            if source.reports:
                break
            __import__("time").sleep(0.01)
        assert frame.status.malformed == 1 and "line 1: longer than" in frame.status.errors[0]
        assert frame.status.reports == 1


class _Unseekable:
    """A stream that is not a regular file (read by the pump thread, like a pipe)."""

    def __init__(self, inner: io.StringIO) -> None:
        self.inner = inner

    def fileno(self) -> int:
        raise OSError("no descriptor")

    def readline(self, limit: int = -1) -> str:
        return self.inner.readline(limit)

    def close(self) -> None:
        pass


def test_a_million_applications_is_one_bad_line_not_a_hang():
    entries = ",".join(["{}"] * 1_000_000)
    frame = _feed('{"neuron_runtime_data":[' + entries + "]}")
    assert frame.status.malformed == 1 and "limit 4,096" in frame.status.errors[0]


def test_a_malformed_system_group_is_counted_once_not_on_every_later_line():
    good = _first_report()
    bad = _mutated(lambda r: r["system_data"].__setitem__("memory_info",
                                                          {"memory_total_bytes": float("nan")}))
    without_system = dict(good)
    without_system.pop("system_data")
    frame = _feed(bad, json.dumps(without_system), json.dumps(without_system))
    assert frame.status.malformed == 1 and frame.status.reports == 3
