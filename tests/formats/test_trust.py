"""Hostile and broken profile folders (docs/trust.md): the query layer writes nothing and reads nothing
outside the profile, table parts never resolve outside it or block on a FIFO, page checksums catch a
flipped bit, and ``validate`` checks what it claims -- one profile or every profile of a dataset."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats.profile_commands import main
from formats.query import QueryError, _writing_operator, open_query
from formats.reader import ProfileError, open_profile
from formats.validate import validate
from tests.fixtures.recorded import Dataset, Recorded


@pytest.fixture
def copy(recorded: Recorded, tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(recorded.path, root)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


# -- the query layer writes nothing ----------------------------------------------------------------

def writes(root: Path, outside: Path) -> list[str]:
    """Every write attempt from issue 14, plus others DuckDB would run on an open connection."""
    summary, metadata = root / "Summary.parquet", root / "Metadata.parquet"
    return [
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{summary}' (FORMAT parquet, USE_TMP_FILE false)",
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{summary}'",
        f"EXPLAIN ANALYZE COPY (SELECT 'pwned' AS a) TO '{metadata}' (FORMAT csv, USE_TMP_FILE false)",
        f"EXPLAIN ANALYZE COPY (SELECT 'x' AS a) TO '{root / 'Link.parquet'}' (FORMAT csv, "
        "USE_TMP_FILE false)",
        f"EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1) TO '{outside}' (USE_TMP_FILE false)",
        f"/* hidden */ explain   analyse copy (select 1) to '{outside}'",
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
        "EXPLAIN ANALYZE INSERT INTO Instruction SELECT * FROM Instruction",
        f"EXPLAIN ANALYZE EXPORT DATABASE '{outside.parent / 'exported'}'",
        f"COPY Instruction TO '{summary}'",
        f"SELECT 1; COPY (SELECT 1) TO '{outside}'",
        f"ATTACH '{outside.with_suffix('.db')}' AS other",
        "INSTALL httpfs", "LOAD httpfs", "SET enable_external_access = true", "RESET lock_configuration",
        "PRAGMA enable_profiling", f"PRAGMA profiling_output = '{outside}'", "CALL pragma_version()",
        "CHECKPOINT", "CREATE MACRO m() AS 1", "DROP VIEW Instruction", "BEGIN TRANSACTION",
        "SET VARIABLE v = 1", "EXPLAIN ANALYZE",
        f"SELECT * FROM query('COPY (SELECT 1) TO ''{outside}''')",
    ]


def test_no_statement_writes(copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.csv"
    (copy / "Link.parquet").symlink_to(copy / "Summary.parquet")  # a link inside the profile: allowed
    before = snapshot(copy)
    with open_query(copy) as q:
        for sql in writes(copy, outside):
            with pytest.raises(QueryError) as err:
                q.sql(sql).fetchall()
            assert "\n" not in str(err.value), sql
            assert any(w in str(err.value) for w in ("refused", "SQL error")), (sql, str(err.value))
    assert snapshot(copy) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_cli_explain_analyze_copy_is_refused(copy: Path, fmt: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's exact bypass: exit 0 and an overwritten Summary before."""
    before = snapshot(copy)
    sql = f"EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{copy / 'Summary.parquet'}' (USE_TMP_FILE false)"
    assert main(["query", str(copy), sql, "--format", fmt]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused" in err and "COPY" in err
    assert snapshot(copy) == before


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM Instruction", "WITH a AS (SELECT 1 AS x) SELECT * FROM a", "VALUES (1), (2)",
    "TABLE Metadata", "FROM Metadata", "DESCRIBE Instruction", "SHOW TABLES", "SUMMARIZE Metadata",
    "EXPLAIN SELECT count(*) FROM Instruction", "EXPLAIN ANALYZE SELECT count(*) FROM Instruction",
    "EXPLAIN (ANALYZE, FORMAT json) SELECT 1", "EXPLAIN ANALYZE (SELECT 1)",
    "PRAGMA table_info('Instruction')", "PRAGMA show_tables", "SELECT 1;",
])
def test_reads_still_run(recorded: Recorded, sql: str) -> None:
    with open_query(recorded.path) as q:
        assert q.sql(sql).fetchall()


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM glob('/etc/*')", "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM read_json_auto('/etc/passwd')", "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('https://example.com/x.parquet')", "SELECT * FROM 'Metadata.parquet'",
])
def test_no_file_outside_the_profile_is_read(recorded: Recorded, sql: str) -> None:
    with open_query(recorded.path) as q, pytest.raises(QueryError) as err:
        q.sql(sql).fetchall()
    assert "Permission" in str(err.value) and "\n" not in str(err.value)


def test_connection_is_locked_and_never_spills(recorded: Recorded) -> None:
    with open_query(recorded.path) as q:
        settings = dict(q.con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                      "('enable_external_access', 'lock_configuration', 'temp_directory',"
                                      " 'autoload_known_extensions')").fetchall())
    assert settings == {"enable_external_access": "false", "lock_configuration": "true",
                        "temp_directory": "", "autoload_known_extensions": "false"}


def test_plan_check_finds_writing_operators() -> None:
    """The second line of defence, on plans DuckDB makes for writes (never run here)."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute("CREATE TABLE t (a INTEGER)")
    for sql, operator in [("INSERT INTO t SELECT 1", "INSERT"),
                          ("CREATE TABLE u AS SELECT 1", "CREATE_TABLE_AS"),
                          ("COPY (SELECT 1) TO '/nonexistent/x.csv'", "COPY_TO_FILE")]:
        plan = con.execute(f"EXPLAIN (FORMAT json) {sql}").fetchall()[0][1]
        assert _writing_operator(json.loads(plan)) == operator
    plan = con.execute("EXPLAIN (FORMAT json) SELECT * FROM t").fetchall()[0][1]
    assert _writing_operator(json.loads(plan)) is None


# -- table parts stay inside the profile and are regular files ---------------------------------

def run_all(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[int, str]]:
    """Each entry point on ``root``, in a thread with a time limit (a FIFO would block forever)."""
    commands = {
        "view": ["view", str(root), "--output-format", "summary-json"],
        "recompute": ["view", str(root), "--output-format", "summary-text", "--recompute"],
        "query": ["query", str(root), "SELECT count(*) FROM Instruction"],
        "validate": ["validate", str(root)],
    }
    results: dict[str, tuple[int, str]] = {}
    for name, argv in commands.items():
        box: list[int | BaseException] = []

        def target(a: list[str] = argv, b: list[int | BaseException] = box) -> None:
            try:
                b.append(main(a))
            except BaseException as exc:  # a traceback: reported below, not lost in the thread
                b.append(exc)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(60)
        assert box, f"{name} hung on {root}"
        assert isinstance(box[0], int), f"{name} raised {box[0]!r}"
        results[name] = (box[0], capsys.readouterr().err)
    return results


def assert_refused(results: dict[str, tuple[int, str]], words: str) -> None:
    for name, (code, err) in results.items():
        assert code == 2, (name, err)
        assert err.count("\n") == 1 and words in err and "Traceback" not in err, (name, err)


def test_symlinked_part_outside_is_refused(copy: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    shutil.move(copy / "HbmUsage.parquet", secret / "HbmUsage.parquet")
    (copy / "HbmUsage.parquet").symlink_to(secret / "HbmUsage.parquet")
    assert_refused(run_all(copy, tmp_path, capsys), "outside the profile")
    with pytest.raises(ProfileError, match=r"HbmUsage\.parquet: refused: a symbolic link"):
        open_profile(copy)


def test_query_through_symlinked_part_cannot_write_outside(copy: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (copy / "Evil.parquet").symlink_to(victim)
    sql = (f"EXPLAIN ANALYZE COPY (SELECT 'x' AS a) TO '{copy / 'Evil.parquet'}' "
           "(FORMAT csv, USE_TMP_FILE false)")
    assert main(["query", str(copy), sql]) == 2
    assert "outside the profile" in capsys.readouterr().err
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("kind", ["fifo", "link-to-fifo", "device", "directory", "socket", "dangling"])
def test_non_regular_parts_are_refused_without_opening(copy: Path, tmp_path: Path, kind: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    part = copy / "DmaUsage.parquet"
    part.unlink()
    if kind == "fifo":
        os.mkfifo(part)
    elif kind == "link-to-fifo":
        os.mkfifo(copy / "pipe")
        part.symlink_to(copy / "pipe")
    elif kind == "device":
        part.symlink_to("/dev/zero")
    elif kind == "directory":
        part.mkdir()
    elif kind == "socket":
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(part))
    else:
        part.symlink_to(copy / "gone.parquet")
    results = run_all(copy, tmp_path, capsys)
    words = {"device": "outside the profile", "dangling": "dangling"}.get(kind, "not a regular file")
    assert_refused(results, words)


def test_many_empty_files(copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(10_000):
        (copy / f"Instruction_{i}.parquet").touch()
    assert_refused(run_all(copy, tmp_path, capsys), "not a readable Parquet file")


# -- integrity ---------------------------------------------------------------------------------

def flip_data_bit(path: Path) -> None:
    """Flip one bit in the first data page of the first column (footer and page header intact)."""
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(0).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    offset = start + column.total_compressed_size - 2  # the last bytes of the chunk: page data
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_writer_writes_page_checksums_and_a_flip_is_detected(copy: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    flip_data_bit(copy / "Summary.parquet")
    with pytest.raises(ProfileError, match=r"Summary\.parquet"):
        open_profile(copy).table("Summary")
    assert main(["validate", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Summary.parquet" in err and "checksum" in err.lower()
    assert main(["view", str(copy), "--output-format", "summary-json"]) == 2
    assert "Summary.parquet" in capsys.readouterr().err


def test_validate_checks_values_not_statistics(copy: Path) -> None:
    """Nulls in a required column counted from the decoded values, with a struct column before it
    (Arrow field index != Parquet leaf index: the old check counted another column's nulls)."""
    table = pq.read_table(copy / "DmaPacket.parquet")
    index = table.schema.get_field_index("transfer_bytes")
    values = table.column(index).to_pylist()
    values[0] = None
    table = table.set_column(index, "transfer_bytes", pa.array(values, table.schema.field(index).type))
    pair = pa.struct([("x", pa.int64()), ("y", pa.int64())])
    table = table.add_column(0, "pair", pa.array([{"x": 1, "y": 2}] * table.num_rows, pair))
    pq.write_table(table, copy / "DmaPacket.parquet", write_statistics=False)
    report = validate(copy)
    assert any(f.column == "transfer_bytes" and "1 null" in f.message for f in report.errors)


def test_validate_a_dataset_folder(tp_dataset: Dataset, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "device"
    shutil.copytree(tp_dataset.root, root)
    profiles = sorted(p.parent for p in root.rglob("Metadata.parquet"))
    assert len(profiles) >= 2
    assert main(["validate", str(root), "-q"]) == 0
    out = capsys.readouterr().out
    assert f"{len(profiles)} profiles under {root}: {len(profiles)} conformant" in out
    flip_data_bit(profiles[0] / "Summary.parquet")
    assert main(["validate", str(root), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["conformant"] is False and len(report["profiles"]) == len(profiles)
    bad = [p for p in report["profiles"] if "error" in p]
    assert len(bad) == 1 and "Summary.parquet" in bad[0]["error"]
    assert all(p["conformant"] for p in report["profiles"] if "error" not in p)


# -- odd values and names ------------------------------------------------------------------------

def set_columns(path: Path, **values: int) -> None:
    table = pq.read_table(path)
    for name, value in values.items():
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, pa.array([value] * table.num_rows, pa.int64()))
    pq.write_table(table, path)


def test_near_int64_max_durations(copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``view --recompute`` ended in OverflowError; a Parquet result beyond int64 in ArrowInvalid."""
    top = 2**63 - 1
    set_columns(copy / "Instruction.parquet", start_ts=0, end_ts=top - 10, duration_ns=top - 10)
    assert main(["view", str(copy), "--output-format", "summary-text", "--recompute"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(copy) in err and "past int64" in err
    out = tmp_path / "sum.parquet"
    sql = "SELECT sum(duration_ns) AS total FROM Instruction"
    assert main(["query", str(copy), sql, "--format", "parquet", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'total'" in err and "beyond int64" in err
    assert main(["query", str(copy), sql, "--format", "json"]) == 0  # exact digits in text formats
    assert json.loads(capsys.readouterr().out)[0]["total"] == (top - 10) * pq.read_metadata(
        copy / "Instruction.parquet").num_rows


@pytest.mark.parametrize("name, words", [("", "empty"), ("a\nb", "control"), ("timestamp", "duplicate")])
def test_bad_column_names(copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                          words: str) -> None:
    """An empty column name reached DuckDB as ``""`` (ParserException: zero-length delimited
    identifier) from ``query``."""
    table = pq.read_table(copy / "HbmUsage.parquet")
    pq.write_table(table.append_column(name, pa.array([1] * table.num_rows)), copy / "HbmUsage.parquet")
    results = run_all(copy, tmp_path, capsys)
    assert_refused(results, "HbmUsage.parquet")
    assert all(words in err for _, err in results.values())


def test_corrupt_pages_met_while_creating_views(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A part whose footer reads but whose pages DuckDB cannot decode while binding a view
    (``TProtocolException: Invalid data``) is named in one line."""
    path = copy / "Metadata.parquet"
    data = bytearray(path.read_bytes())
    for i in range(4, len(data) // 2):
        data[i] = 0xFF
    path.write_bytes(bytes(data))
    assert main(["query", str(copy), "SELECT count(*) FROM Instruction"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Metadata.parquet" in err and "Traceback" not in err


def test_timestamps_python_cannot_hold(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A nanosecond timestamp column (an unknown table's) printed as JSON or a table: to_pylist raised
    ValueError; in Metadata the reader raised it too."""
    when = pa.array([2**62, 0], pa.timestamp("ns"))
    pq.write_table(pa.table({"when": when}), copy / "Mystery.parquet")
    for fmt in ("json", "table"):
        assert main(["query", str(copy), "SELECT * FROM Mystery", "--format", fmt]) == 0
        assert "2116-02-20" in capsys.readouterr().out
    metadata = pq.read_table(copy / "Metadata.parquet")
    pq.write_table(metadata.append_column("when", when.slice(0, 1)), copy / "Metadata.parquet")
    with pytest.raises(ProfileError, match="Metadata"):
        open_profile(copy)


def test_column_names_that_are_not_utf8(copy: Path, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in a footer's column name: UnicodeDecodeError from pyarrow."""
    path = copy / "HbmUsage.parquet"
    table = pq.read_table(path)
    pq.write_table(table.append_column("zzzzname", pa.array([1] * table.num_rows)), path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b"zzzzname", b"zz\xff\xfename"))
    results = run_all(copy, tmp_path, capsys)
    # the views show the rest (one warning line); query and validate refuse, naming the part
    for name in ("view", "recompute"):
        code, err = results.pop(name)
        assert code == 0 and err.count("\n") == 1 and "table HbmUsage left out" in err, (name, err)
    assert_refused(results, "HbmUsage.parquet")


def test_sql_scans_verify_page_checksums_first(copy: Path) -> None:
    """DuckDB checks no page CRC and one flipped bit in a DmaPacket page crashed the process
    (SIGSEGV, ``view --recompute``): every part is verified from its raw bytes before a scan."""
    import subprocess
    import sys

    from formats.integrity import verify_part

    path = copy / "DmaPacket.parquet"
    clean = path.read_bytes()
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(0).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    detected = 0
    for offset in range(start + column.total_compressed_size - 64, start + column.total_compressed_size):
        data = bytearray(clean)
        data[offset] ^= 0x20
        path.write_bytes(bytes(data))
        os.utime(path, ns=(offset, offset))  # a new mtime: not the cached verdict
        try:
            verify_part(path)
        except ProfileError as exc:
            assert "DmaPacket.parquet" in str(exc)
            detected += 1
    assert detected == 64
    done = subprocess.run([sys.executable, "-m", "formats.profile_commands", "view", str(copy),
                           "--output-format",
                           "summary-text", "--recompute"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "DmaPacket.parquet: page checksum mismatch" in done.stderr


def test_parts_without_checksums_are_decoded_once(copy: Path) -> None:
    """Another writer's parts (no CRCs): small ones are decoded once before DuckDB reads them."""
    from formats.integrity import verify_part

    path = copy / "DmaPacket.parquet"
    pq.write_table(pq.read_table(path), path, compression="none", use_dictionary=False)
    verify_part(path)  # sound: passes
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(0).column(0)
    data = bytearray(path.read_bytes())
    for i in range(column.data_page_offset + 20, column.data_page_offset + column.total_compressed_size):
        data[i] = 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ProfileError, match=r"DmaPacket\.parquet"):
        verify_part(path)


def test_text_that_is_not_utf8(copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bytes that are not UTF-8 reach Python as lone surrogates: in the SQL (a TypeError from DuckDB
    before) and in the profile's path (pyarrow cannot open it)."""
    assert main(["query", str(copy), "SELECT '\udcff' AS x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid UTF-8" in err
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xffprofile"))
    shutil.copytree(copy, odd)
    assert_refused(run_all(odd, tmp_path, capsys), "not valid UTF-8")


def test_null_opcodes_recompute(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A null opcode (fuzzed Instruction part) ended ``view --recompute`` in ``None is not in list``:
    the OpcodeSummary keys it as the sweep does, the unlisted opcode 0."""
    path = copy / "Instruction.parquet"
    table = pq.read_table(path)
    index = table.schema.get_field_index("opcode")
    opcodes = table.column("opcode").to_pylist()
    opcodes[0] = None
    field = table.schema.field(index).with_nullable(True)
    table = table.set_column(index, field, pa.array(opcodes, field.type))
    pq.write_table(table, path, write_page_checksum=True)
    assert main(["view", str(copy), "--output-format", "summary-json", "--recompute"]) == 0
    assert json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("value", ["not a number", "1e400", True])
def test_capture_state_of_retyped_metadata(copy: Path, value: object) -> None:
    """Metadata is file data: ``requested_execution`` of another type is unknown, not a ValueError."""
    from formats.dataset import capture_state

    path = copy / "Metadata.parquet"
    table = pq.read_table(path)
    column = pa.array([value] * table.num_rows)
    name = "requested_execution"
    index = table.schema.get_field_index(name)
    table = table.set_column(index, name, column) if index >= 0 else table.append_column(name, column)
    pq.write_table(table, path, write_page_checksum=True)
    assert capture_state(copy).requested_execution is None


_FOOTER_FLIPS = """
import sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from formats import integrity
from formats.intervals import time_slices
from formats.reader import ProfileError
base, mutant = Path(sys.argv[1]), Path(sys.argv[2])
table = pa.table({"start_ts": np.arange(4000, dtype=np.int64), "name": pa.array(["op"] * 4000)})
pq.write_table(table, base, row_group_size=500, write_page_checksum=True)
data = base.read_bytes()
start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
for pos in range(start, min(start + 400, len(data) - 8)):
    flipped = bytearray(data)
    flipped[pos] ^= 1 << (pos % 8)
    mutant.write_bytes(flipped)
    assert time_slices([mutant], "start_ts", 1000)
    integrity._verified.clear()
    try:
        integrity.verify_part(mutant)
    except ProfileError:
        pass
print("survived")
"""


def test_row_group_slices_of_damaged_footers_never_abort(tmp_path: Path) -> None:
    """A flipped bit in a footer made pyarrow's ``Statistics`` throw a C++ exception it cannot convert
    (``ColumnMetaData type does not match ColumnDescriptor physical type``, ``Definition level histogram
    size mismatch``): ``terminate``, the whole process gone. Row-group slices read footers through
    DuckDB, which raises, and so does the page-checksum walk (``formats.integrity``); the child must
    live through every flip in the footer's first 400 bytes."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _FOOTER_FLIPS, str(tmp_path / "base.parquet"),
                             str(tmp_path / "mutant.parquet")], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert result.returncode == 0 and "survived" in result.stdout, result.stderr[-400:]


def test_partition_names_are_parsed_in_linear_time() -> None:
    """A profile named by a 10^5-character segment with no "=" (a fuzzed Metadata value) held
    ``view --recompute`` for a minute: the partition regex rescanned the segment from every character."""
    from formats.headline import _partitions

    box: list[dict[str, str]] = []
    name = "m" * 1_000_000 + "/core=3"
    thread = threading.Thread(target=lambda: box.append(_partitions(name)), daemon=True)
    thread.start()
    thread.join(60)
    assert box == [{"core": "3"}]
    assert _partitions("model=bert/core=0/execution=2") == {"model": "bert", "core": "0", "execution": "2"}
    assert _partitions("x/rank=1") == {"rank": "1"}


def test_a_retyped_warm_up_mark_is_one_error_line(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Metadata.warm_up_execution stored as int8 1: the note 'holds a warm-up execution ... requested
    execution None' came before the reader's refusal, two lines on stderr for one error."""
    from formats.dataset import capture_state

    path = copy / "Metadata.parquet"
    table = pq.read_table(path)
    index = table.schema.get_field_index("warm_up_execution")
    as_int8 = pa.array([1] * table.num_rows, pa.int8())
    pq.write_table(table.set_column(index, "warm_up_execution", as_int8), path)
    assert capture_state(copy).warm_up is False
    for argv in (["view", str(copy), "--output-format", "summary-json"],
                 ["query", str(copy), "SELECT count(*) FROM Instruction"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "warm_up_execution" in err and "None" not in err, err


def test_json_views_write_any_cell_type(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Summary column holding dates (another tool's file, or damage) ended summary-json with
    'Object of type date is not JSON serializable'."""
    import datetime as dt
    from decimal import Decimal

    from formats.jsonsafe import json_value

    path = copy / "Summary.parquet"
    table = pq.read_table(path)
    table = table.append_column("made_on", pa.array([dt.date(2026, 11, 24)] * table.num_rows, pa.date32()))
    pq.write_table(table, path)
    assert main(["view", str(copy), "--output-format", "summary-json"]) == 0, capsys.readouterr().err
    assert "2026-11-24" in capsys.readouterr().out
    legacy = copy.parent / "legacy.json"
    argv = ["view", str(copy), "--output-format", "json", "-o", str(legacy)]
    assert main(argv) == 0, capsys.readouterr().err
    assert "2026-11-24" in json.dumps(json.loads(legacy.read_text())["summary"])
    assert json_value([Decimal("2"), Decimal("NaN"), float("inf"), b"\x01", dt.timedelta(seconds=2)]) == \
        [2, None, None, "01", 2.0]


@pytest.mark.parametrize("table", ["DmaPacket", "Summary", "Flow"])
def test_text_views_show_what_is_readable_of_a_profile_with_a_corrupt_optional_table(
        copy: Path, capsys: pytest.CaptureFixture[str], table: str) -> None:
    """A truncated optional table: summary-text and analyze show the rest with one warning line
    naming the table left out, as neuron-explorer's banner does (both refused the whole profile
    before); the table is left out whole, never read in part. An essential table is still refused."""
    from explorer.profile_cli import main as cli

    part = next(copy.glob(f"{table}*.parquet"))
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    for argv in (["view", str(copy), "--output-format", "summary-text"], ["analyze", str(copy)]):
        assert cli(argv) == 0
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and f"table {table} left out" in err and "warning" in err, err
        assert "device time" in out
    instruction = next(copy.glob("Instruction*.parquet"))
    instruction.write_bytes(instruction.read_bytes()[:100])
    assert cli(["view", str(copy), "--output-format", "summary-text"]) == 2
    assert "not a readable Parquet file" in capsys.readouterr().err


def test_text_views_of_a_folder_leave_out_an_unreadable_profile(
        copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder of profiles with one damaged execution: view and analyze show the readable ones with
    one warning line naming the one left out, as neuron-explorer's banner does (both refused the
    whole folder before); a folder whose only profile is unreadable is still one error, exit 2."""
    from explorer.profile_cli import main as cli

    folder = tmp_path / "runs"
    shutil.copytree(copy, folder / "execution=1")
    shutil.copytree(copy, folder / "execution=2")
    metadata = next((folder / "execution=2").glob("Metadata*.parquet"))
    metadata.write_bytes(b"junk")
    for argv in (["view", str(folder), "--output-format", "summary-text"], ["analyze", str(folder)]):
        assert cli(argv) == 0
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and "left out" in err and "execution=2" in err, err
        assert "execution=1" in out and "device time" in out
    shutil.rmtree(folder / "execution=1")
    for argv in (["view", str(folder), "--output-format", "summary-text"], ["analyze", str(folder)]):
        assert cli(argv) == 2
        assert "not a readable Parquet file" in capsys.readouterr().err
