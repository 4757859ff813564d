"""formats.source_access: which source files a profile may make a viewer read (issue 14: the viewer
showed any file a profile named, and a name over 255 bytes ended it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from formats.source_access import (
    MAX_BYTES,
    SourceAccess,
    SourceStatus,
    check_name,
    locate,
    read_source,
    trusted_working_dir,
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "model.py").write_text("a = 1\n\tb = 2\nc = '\x1b[2J'\n")
    (tmp_path / "secret.txt").write_text("not yours\n")
    return root


def test_under_the_source_root_by_suffix(project: Path) -> None:
    access = SourceAccess(source_root=project)
    assert locate("/old/place/pkg/model.py", project) == project / "pkg" / "model.py"
    shown = read_source("/old/place/pkg/model.py", access)
    assert shown.status is SourceStatus.OK and shown.shown_as == "pkg/model.py"
    # tabs expanded; an escape sequence in the file never reaches the terminal
    assert shown.lines == ("a = 1", "    b = 2", "c = '\ufffd[2J'")
    missing = read_source("/old/missing.py", access)
    assert missing.status is SourceStatus.NOT_FOUND and "not found" in missing.message


def test_outside_every_root_needs_confirmation(project: Path) -> None:
    access = SourceAccess(source_root=project)
    asked = read_source("/etc/passwd", access)
    assert asked.status is SourceStatus.NEEDS_CONFIRM and asked.lines == ()
    assert asked.path == Path(os.path.realpath("/etc/passwd")) and "outside" in asked.message
    allowed = read_source("/etc/passwd", access.confirm(asked.path))
    assert allowed.status is SourceStatus.OK and allowed.lines
    assert read_source("/etc/passwd", SourceAccess()).status is SourceStatus.NEEDS_CONFIRM


def test_no_escape_by_symlink_or_dotdot(project: Path) -> None:
    access = SourceAccess(source_root=project)
    (project / "pkg" / "link.py").symlink_to(project.parent / "secret.txt")
    assert read_source(str(project / "pkg" / "link.py"), access).status is SourceStatus.NEEDS_CONFIRM
    assert read_source("/x/pkg/link.py", access).status is SourceStatus.NEEDS_CONFIRM  # found by suffix
    dotdot = f"{project}/pkg/../../secret.txt"
    assert read_source(dotdot, access).status is SourceStatus.NEEDS_CONFIRM
    # a directory symlinked into the root from outside does not make the outside trusted
    (project / "elsewhere").symlink_to(project.parent, target_is_directory=True)
    assert read_source(str(project / "elsewhere" / "secret.txt"), access).status is SourceStatus.NEEDS_CONFIRM


def test_recorded_working_directory(project: Path) -> None:
    recorded = str(project / "pkg" / "model.py")
    mine = SourceAccess.for_profile({"capture_working_dir": str(project)})
    assert mine.working_dir == project.resolve()
    assert read_source(recorded, mine).status is SourceStatus.OK
    assert read_source(str(project.parent / "secret.txt"), mine).status is SourceStatus.NEEDS_CONFIRM
    # the recorded directory is profile data: "/", the home directory, system folders are not trusted
    for hostile in ("/", str(Path.home()), "/etc", "/proc/self", str(project / "missing")):
        access = SourceAccess.for_profile({"capture_working_dir": hostile})
        assert access.working_dir is None and access.working_dir_note, hostile
        assert read_source("/etc/passwd", access).status is SourceStatus.NEEDS_CONFIRM
    assert trusted_working_dir("x" * 300)[0] is None
    assert SourceAccess.for_profile({}).working_dir is None and SourceAccess.for_profile(None).roots == ()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_recorded_directory_of_another_user_is_not_trusted(project: Path) -> None:
    os.chown(project, 12345, 12345)
    access = SourceAccess.for_profile({"capture_working_dir": str(project)})
    assert access.working_dir is None and "another user" in access.working_dir_note


def test_bad_names_and_special_files_are_messages(project: Path, tmp_path: Path) -> None:
    access = SourceAccess(source_root=project)
    for name in ("/tmp/" + "x" * 300 + ".py", "a\x00b.py", "\ud800.py", "", "/" + "a/" * 3000):
        shown = read_source(name, access)
        assert shown.status is SourceStatus.REFUSED and shown.message and "\n" not in shown.message, name
    assert "255" in check_name("/tmp/" + "x" * 300)
    assert read_source(str(project / "pkg"), access).status is SourceStatus.REFUSED  # a directory
    big = project / "big.py"
    with open(big, "wb") as handle:
        handle.truncate(MAX_BYTES + 1)
    refused = read_source(str(big), access)
    assert refused.status is SourceStatus.REFUSED and "MiB" in refused.message


def test_a_fifo_is_refused_without_hanging(project: Path) -> None:
    fifo = project / "pkg" / "pipe.py"
    os.mkfifo(fifo)
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(read_source(str(fifo), SourceAccess(project))))
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the reader before failing
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO named as a source file hung")
    assert result[0].status is SourceStatus.REFUSED  # type: ignore[attr-defined]


def test_unreadable_file_is_a_message(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    shown = read_source(str(project / "pkg" / "model.py"), SourceAccess(project))
    assert shown.status is SourceStatus.UNREADABLE and "Permission denied" in shown.message
