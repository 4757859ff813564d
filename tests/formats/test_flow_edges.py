"""Flow carries the program's semaphore dependencies, not only the DMA triggers."""

from __future__ import annotations

import duckdb
import numpy as np

import neuroncore as nc
from formats import open_profile, record_profile
from neuroncore.compiler.program import RES_CC, RES_DMA
from neuroncore.events import EventSink
from neuroncore.workloads import get


def test_semaphore_edges_match_the_program_and_point_back_in_time(tmp_path):
    sink = EventSink()
    graph = get("bert-layer").graph(batch=1, seq=32, hidden=64, heads=4, intermediate=128)
    with record_profile(tmp_path / "p", sink):
        model = nc.Instance("trn1.2xlarge", sink=sink).core(0).load(nc.compile(graph, "trn1"))
        model.execute(timing_only=True)
    program = model.program
    waits = [(int(d), int(i)) for i in np.flatnonzero(program.resource < RES_DMA)
             for d in program.deps(int(i)) if program.resource[d] != RES_CC]
    profile = open_profile(tmp_path / "p")
    flows = [str(f) for f in profile.files("Flow")]
    instructions = [str(f) for f in profile.files("Instruction")]
    con = duckdb.connect()
    edges = con.sql(f"SELECT in_id, out_id, in_table FROM read_parquet({flows}) "
                    "WHERE dependency_type = 'SEMAPHORE'").fetchall()
    assert sorted((a, b) for a, b, _ in edges) == sorted(waits)  # one execution: base 0
    assert {t for _, _, t in edges} == {"instruction", "dma_block"}
    late = con.execute(f"""SELECT count(*) FROM read_parquet({flows}) f
        JOIN read_parquet({instructions}) a ON f.in_id = a.id
        JOIN read_parquet({instructions}) b ON f.out_id = b.id
        WHERE f.dependency_type = 'SEMAPHORE' AND a.end_ts > b.start_ts""").fetchall()[0][0]
    assert late == 0
    triggers = con.execute(f"SELECT count(*) FROM read_parquet({flows}) "
                           "WHERE dependency_type = 'DMA_TRIGGER'").fetchall()[0][0]
    assert int(np.sum(program.resource == RES_DMA)) == triggers
