"""``formats.attribution``: op, layer and source-line time from the same op events, by hand and against
the rollups the recorder stores (HloInstruction / FrameworkNode)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from formats.attribution import attribute, module_kind
from formats.figures import Window
from formats.reader import open_profile
from tests.fixtures.hand_profiles import write_tiny

SAMPLE = (Path(__file__).resolve().parents[2] / "sample_profiles" / "llama-decode-tp2" / "device"
          / "model=llama_decode" / "core=0" / "execution=2")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return open_profile(write_tiny(tmp_path_factory.mktemp("attr") / "tiny"))


def test_ops_layers_and_lines_by_hand(tiny) -> None:
    a = attribute(tiny)
    assert {o.name: o.inclusive_ns for o in a.ops.values()} == {"dot.1": 200, "dot.2": 300, "tanh.3": 100}
    assert {o.name: o.instructions for o in a.ops.values()} == {"dot.1": 3, "dot.2": 2, "tanh.3": 1}
    assert a.layers["model/mlp"].inclusive_ns == 200 and a.layers["model/attn"].inclusive_ns == 300
    model = a.layers["model"]
    assert model.inclusive_ns == 500  # [0,400) ∪ [500,600)
    assert model.self_ns == 100  # busy in model while neither child is: tanh.3
    assert model.instructions == 6 and a.layers["model/mlp"].parent == "model"
    # self times tile the root only where siblings do not overlap: mlp and attn share [100,200)
    assert sum(n.self_ns for n in a.layers.values()) == model.inclusive_ns + 100
    line10, line20 = a.lines[("m.py", 10)], a.lines[("m.py", 20)]
    assert (line10.inclusive_ns, line10.self_ns, line10.instructions) == (300, 300, 4)  # dot.1 ∪ tanh.3
    assert line20.inclusive_ns == a.layers["model/attn"].inclusive_ns  # same events, same time
    assert a.by_location


def test_a_window_clips_every_node(tiny) -> None:
    a = attribute(tiny, Window.span(50, 350))
    assert {o.name: o.inclusive_ns for o in a.ops.values()} == {"dot.1": 150, "dot.2": 250, "tanh.3": 0}
    assert a.layers["model"].inclusive_ns == 300  # [50,350)


def test_module_kind() -> None:
    assert module_kind("model/layers.3/mlp/down_proj") == "down_proj"
    assert module_kind("model/layers.3") == "layers"


def test_sample_profile_matches_the_stored_rollups_and_lines_reconcile() -> None:
    if not SAMPLE.exists():
        pytest.skip("sample profile not present")
    profile = open_profile(SAMPLE)
    a = attribute(profile, use_stored=False)  # scanned from the events, compared with what was stored
    assert attribute(profile).layers == a.layers and attribute(profile).lines == a.lines
    stored_ops = dict(duckdb.sql(f"SELECT raw_hlo_id::VARCHAR, sum(active_time_ns) FROM "
                                 f"read_parquet('{SAMPLE}/HloInstruction.parquet') GROUP BY 1").fetchall())
    assert {k: v.inclusive_ns for k, v in a.ops.items()} == stored_ops
    stored_layers = dict(duckdb.sql(f"SELECT node_name, active_time_ns FROM "
                                    f"read_parquet('{SAMPLE}/FrameworkNode.parquet')").fetchall())
    assert {k: v.inclusive_ns for k, v in a.layers.items()} == stored_layers
    # the line every MLP projection is traced from shows exactly the MLP layers' time (the tree's)
    linear = [line for line in a.lines.values() if line.function == "linear"]
    assert linear, "the llama workload's linear() call site"
    projections = {a.ops[k].parent for line in linear for k in line.ops}
    kinds = {module_kind(p) for p in projections}
    assert kinds <= {"down_proj", "gate_proj", "up_proj", "q_proj", "k_proj", "v_proj", "o_proj"}
    assert a.kinds["mlp"].layers == 2 and a.kinds["mlp"].inclusive_ns == \
        a.layers["model/layers.0/mlp"].inclusive_ns + a.layers["model/layers.1/mlp"].inclusive_ns
