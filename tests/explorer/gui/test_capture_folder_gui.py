"""``neuron-explorer out/bert`` -- a capture's top folder, not its ``device/`` -- crashed every
timeline fetch with DuckDB's ``Overflow in multiplication of INT64`` (the system profile's host
clock put on the device timeline) and exited 1 with ``--screenshot``. It now opens the device
profiles; the system profile alone is one line and exit 2. Both failed before the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT, REPO

require_gui()

CAPTURE = BERT.parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "explorer.gui.launcher", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
                          timeout=180)


def test_session_of_a_capture_folder_is_its_device_profile() -> None:
    from explorer.gui.session import SessionError, open_session

    session = open_session([CAPTURE], connect=False)
    assert [p.label for p in session.profiles] == ["bert-layer"]
    assert session.profiles[0].path.resolve().is_relative_to(BERT.resolve())
    assert not session.banner
    with pytest.raises(SessionError, match=r"system \(host-side\) profile only"):
        open_session([CAPTURE / "system"], connect=False)


def test_screenshot_of_a_capture_folder(tmp_path: Path) -> None:
    out = tmp_path / "top.png"
    done = _cli(str(CAPTURE), "--screenshot", str(out))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "could not read" not in done.stderr, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    alone = _cli(str(CAPTURE / "system"), "--screenshot", str(tmp_path / "s.png"))
    lines = [line for line in alone.stderr.splitlines() if line.startswith("neuron-explorer")]
    assert alone.returncode == 2 and len(lines) == 1 and "system (host-side) profile only" in lines[0]



def test_long_program_names_are_drawn_on_the_row_axis(qt_app: object, tmp_path: Path) -> None:
    """A generation capture's groups (``model Gemma2ForCausalLM.context_encoding.64``, ...) had
    blank header rows: a tick label wider than the row axis is not drawn at all. The label is cut
    at its start, keeping the part that tells the programs apart."""
    import shutil

    import numpy as np
    from PySide6.QtGui import QImage

    from explorer.gui.screenshot import render_screenshot
    from explorer.gui.timeline import header_label

    source = next(p.parent for p in BERT.rglob("Instruction.parquet"))
    for program in ("context_encoding", "token_generation"):
        shutil.copytree(source, tmp_path / "cap" / "device" / f"model=Gemma2ForCausalLM.{program}.64"
                        / "core=0" / "execution=2")
    assert header_label("model Gemma2ForCausalLM.token_generation.64").endswith("token_generation.64")
    layout = render_screenshot([tmp_path / "cap"], tmp_path / "g.png", size=(1400, 850))
    image = QImage(str(layout.path)).convertToFormat(QImage.Format.Format_RGBA8888)
    pixels = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes()).reshape(
        image.height(), image.bytesPerLine() // 4, 4)[:, : image.width(), :3]
    headers = [(key, band) for key, band in layout.bands.items() if key.split("/")[0] == key.split("/")[1]]
    assert len(headers) == 2
    for key, (top, bottom) in headers:
        axis = pixels[top:bottom, : layout.columns[0] - 4].astype(int)
        assert int((axis.sum(axis=2) < 300).sum()) > 20, f"{key}: no label drawn"
