"""The query layer: views over one profile or a hive-partitioned folder, read-only, and its CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from formats.profile_commands import main
from formats.query import QueryError, open_query
from tests.fixtures.recorded import Dataset, Recorded


def test_one_profile_views(recorded: Recorded) -> None:
    with open_query(recorded.path) as q:
        assert q.single and "Instruction" in q.tables and "CcOp" in q.tables
        (n,) = q.sql("SELECT count(*) FROM Instruction").fetchall()[0]
        assert n == recorded.rows("instruction")
        assert q.sql("SELECT count(*) FROM CcOp").fetchall() == [(0,)]  # absent table: empty view
        columns = [r[0] for r in q.sql("DESCRIBE CcOp").fetchall()]
        assert columns[:3] == ["start_ts", "end_ts", "duration_ns"]
        engines = {r[0] for r in q.sql("SELECT DISTINCT engine FROM ActiveTime").fetchall()}
        assert engines <= {"Tensor", "Vector", "Scalar", "GpSimd", "Sync"}  # normalised like the reader


def test_folder_of_profiles_has_partition_columns(tp_dataset: Dataset) -> None:
    with open_query(tp_dataset.root) as q:
        assert not q.single and len(q.profiles) == 2
        assert q.partitions == {"model": "VARCHAR", "core": "BIGINT", "execution": "BIGINT"}
        sql = "SELECT core, execution, count(*) FROM Instruction GROUP BY ALL ORDER BY core"
        rows = q.sql(sql).fetchall()
        expected = [(r.core, 1, int(r.timeline.layout.instr_nodes.size)) for r in tp_dataset.result.ranks]
        assert rows == sorted(expected)
        profiles = q.sql("SELECT DISTINCT profile FROM Summary ORDER BY 1").fetchall()
        assert [p[0] for p in profiles] == sorted(f"model=llama_decode/core={r.core}/execution=1"
                                                  for r in tp_dataset.result.ranks)
        (ops,) = q.sql("SELECT count(*) FROM CcOp WHERE core = 1").fetchall()[0]
        assert ops == len(tp_dataset.result.collectives)


def test_incomplete_profiles_are_skipped_unless_asked(tp_dataset: Dataset, tmp_path: Path) -> None:
    root = tmp_path / "device"
    shutil.copytree(tp_dataset.root, root)
    one = next(root.glob("model=*/core=1/execution=1"))
    one.rename(one.with_name("execution=1.incomplete"))
    with open_query(root) as q:
        assert len(q.profiles) == 1 and len(q.skipped) == 1
    with open_query(root, include_incomplete=True) as q:
        assert q.sql("SELECT DISTINCT execution FROM Instruction").fetchall() == [(1,)]


@pytest.mark.parametrize("sql, words", [
    ("COPY (SELECT 1) TO 'out.csv'", "read-only"),
    ("ATTACH 'other.db'", "read-only"),
    ("INSTALL httpfs", "read-only"),
    ("CREATE TABLE t AS SELECT 1", "read-only"),
    ("SET enable_external_access = true", "read-only"),
    ("SELECT * FROM read_csv('/etc/passwd')", "Permission"),
    ("SELECT 1; SELECT 2", "one statement"),
    ("SELEC 1", "syntax error"),
    ("SELECT nope FROM Instruction", "nope"),
])
def test_refused_and_failing_sql_is_one_line(recorded: Recorded, tmp_path: Path, sql: str,
                                             words: str) -> None:
    with open_query(recorded.path) as q, pytest.raises(QueryError) as err:
        q.sql(sql).fetchall()
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out.csv").exists() and not Path("out.csv").exists()


def test_cli_prints_a_table(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    sql = "SELECT opcode, count(*) AS n FROM Instruction GROUP BY 1"
    assert main(["query", str(recorded.path), sql]) == 0
    out = capsys.readouterr().out
    assert "MATMUL" in out and "rows" in out


def test_cli_lists_tables(recorded: Recorded, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", str(recorded.path)]) == 0
    out = capsys.readouterr().out
    assert "Instruction" in out and "Summary" in out


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_cli_writes_formats(tp_dataset: Dataset, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"result.{fmt}"
    sql = ("SELECT core, opcode, count(*) AS n, sum(duration_ns) AS t FROM Instruction "
           "GROUP BY ALL ORDER BY ALL")
    assert main(["query", str(tp_dataset.root), sql, "--format", fmt, "-o", str(out)]) == 0
    if fmt == "csv":
        table = pacsv.read_csv(out)
    elif fmt == "json":
        table = pa.Table.from_pylist(json.loads(out.read_text()))
    else:
        table = pq.read_table(out)
    assert table.column_names == ["core", "opcode", "n", "t"]
    assert set(table.column("core").to_pylist()) == {r.core for r in tp_dataset.result.ranks}
    assert sum(table.column("n").to_pylist()) == sum(int(r.timeline.layout.instr_nodes.size)
                                                     for r in tp_dataset.result.ranks)


def test_cli_write_attempt_exits_2(recorded: Recorded, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x.parquet"
    assert main(["query", str(recorded.path), f"COPY Instruction TO '{target}'"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "read-only" in err and not target.exists()


def test_a_piped_table_keeps_every_cell_whole(recorded: Recorded, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal (capsys, like a pipe): a table wider than COLUMNS prints each cell on one line
    instead of folding column names and values into 80 characters."""
    monkeypatch.setenv("COLUMNS", "80")
    names = ", ".join(f"'{'x' * 30}' AS long_column_name_{i}" for i in range(4))
    assert main(["query", str(recorded.path), f"SELECT {names} FROM Summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "long_column_name_0" in line)
    assert all(f"long_column_name_{i}" in header for i in range(4)) and len(header) > 80
    assert sum("x" * 30 in line for line in lines) == 1
