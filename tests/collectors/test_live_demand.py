"""Live state on demand (``NEURONSCOPE_LIVE`` unset/auto, the default): a model-running process
publishes only while a watcher (neuron-top, neuron-monitor) holds a watch file, and until then puts
no listener on its sink (the core builds no records for it)."""

from __future__ import annotations

import subprocess

import pytest

from collectors import live, livedemand
from collectors.livereader import read_live_state
from neuroncore.events import EventSink
from neuronscope import settings
from tests.fixtures.live import PYTHON, REPO, live_env, wait_for

# runs executions until told to stop; says once whether its sink had a listener after 50 of them
AUTO_PUBLISHER = """
import os, sys, time
import neuroncore as nc
from neuroncore.events import sink
stop = sys.argv[1]
b = nc.GraphBuilder("tiny_auto")
x = b.parameter("x", (64, 128), "bf16")
y = b.matmul(x, b.weight("w", (128, 64), "bf16"))
model = nc.Instance("trn1.2xlarge").core(0).load(nc.compile(b.build([y]), "trn1"))
for _ in range(50):
    model.execute(timing_only=True)
print("active" if sink.active else "inactive", flush=True)
deadline = time.time() + 60
while not os.path.exists(stop) and time.time() < deadline:
    model.execute(timing_only=True)
    time.sleep(0.001)
"""


@pytest.fixture
def auto_env(monkeypatch, tmp_path):
    monkeypatch.setenv(settings.LIVE.name, "auto")
    monkeypatch.setenv(settings.LIVE_DIR.name, str(tmp_path / "live"))
    return tmp_path / "live"


def test_unwatched_sink_gets_a_probe_not_a_listener(auto_env):
    sink = EventSink()
    live.install(sink)
    live.install(sink)  # once per sink
    sink.poll(now=0.0)
    assert not sink.active  # nobody watches: the core builds nothing
    assert not auto_env.exists()  # and nothing was created


def test_a_watcher_makes_the_next_due_poll_attach(auto_env):
    sink = EventSink()
    live.install(sink)
    sink.poll(now=0.0)
    with livedemand.Watch(auto_env) as watch:
        assert watch.path.exists() and livedemand.watched(auto_env)
        sink.poll(now=0.5)  # not due yet (once a second)
        assert not sink.active
        sink.poll(now=10.0)
        assert sink.active
    assert not watch.path.exists() and not livedemand.watched(auto_env)


def test_a_dead_watchers_file_does_not_count(auto_env):
    auto_env.mkdir(mode=0o700)
    gone = 2**22 + 17  # above the largest pid_max: no such process
    livedemand.watch_file(auto_env, gone).write_text("{}")
    assert not livedemand.watched(auto_env)
    with livedemand.Watch(auto_env):
        assert not livedemand.watch_file(auto_env, gone).exists()  # the next watcher cleans up


def test_off_and_on(monkeypatch, tmp_path):
    monkeypatch.setenv(settings.LIVE_DIR.name, str(tmp_path))
    monkeypatch.setenv(settings.LIVE.name, "0")
    sink = EventSink()
    live.install(sink)
    sink.poll(now=0.0)
    assert not sink.active
    monkeypatch.setenv(settings.LIVE.name, "bogus")  # warns, counts as the default (auto)
    assert live.mode() is settings.LiveMode.AUTO


def test_a_program_publishes_once_watched_and_not_before(tmp_path):
    live_dir, stop = tmp_path / "live", tmp_path / "stop"
    proc = subprocess.Popen([PYTHON, "-c", AUTO_PUBLISHER, str(stop)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, env=live_env(live_dir, NEURONSCOPE_LIVE="auto"))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "inactive"
        assert not live_dir.exists()  # 50 executions, a poll, nobody watching: nothing written
        with livedemand.Watch(live_dir):
            states = wait_for(lambda: [s for s in read_live_state(live_dir) if s.pid == proc.pid])
            assert states[0].models  # the model loaded before the watch re-announced itself
        stop.write_text("")
        assert proc.wait(timeout=20) == 0
        assert list(live_dir.glob("*.json")) == []  # a normal exit removes its file
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_neuron_monitor_watches_while_it_runs(monkeypatch, tmp_path):
    from collectors import monitor

    live_dir = tmp_path / "live"
    monkeypatch.setenv(settings.LIVE_DIR.name, str(live_dir))
    seen: list[bool] = []
    monkeypatch.setattr(monitor.Monitor, "run", lambda self, out, count: seen.append(
        livedemand.watched(live_dir)))
    assert monitor.main(["--count", "1", "--instance", "trn1.2xlarge"]) == 0
    assert seen == [True]
