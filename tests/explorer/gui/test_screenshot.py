"""Headless rendering: ``--screenshot`` writes a PNG whose engine rows are drawn in their colours, and
the command line answers mistakes with one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.gui import require_gui
from tests.fixtures.samples import BERT, LLAMA_TP2, REPO

require_gui()


def _pixels(path: Path) -> np.ndarray:
    from PySide6.QtGui import QImage

    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGBA8888)
    buffer = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes())
    return buffer.reshape(image.height(), image.bytesPerLine() // 4, 4)[:, : image.width()].copy()


def test_screenshot_shows_the_engine_rows_in_their_colours(qt_app: Any, tmp_path: Path) -> None:
    from explorer.gui.colors import ENGINE_COLORS
    from explorer.gui.screenshot import render_screenshot

    out = tmp_path / "bert.png"
    layout = render_screenshot([BERT], out, size=(1400, 850))
    pixels = _pixels(out)
    assert pixels.shape[:2] == (layout.height, layout.width) == (850, 1400)
    left, right = layout.columns
    group = next(key.split("/")[0] for key in layout.bands)
    for engine in ("Tensor", "TensorMatrix", "Vector", "Scalar", "Sync"):
        top, bottom = layout.bands[f"{group}/{engine}"]
        band = pixels[top:bottom, left:right, :3].reshape(-1, 3)  # busy bars: low where the engine is idle
        expected = np.array(ENGINE_COLORS[engine][:3])
        drawn = int(np.sum(np.all(np.abs(band.astype(int) - expected) <= 3, axis=1)))
        assert drawn >= 8, f"{engine} row shows no {engine} colour"
        for other, colour in ENGINE_COLORS.items():
            if other != engine and other in ("Tensor", "TensorMatrix", "Vector", "Scalar", "Sync"):
                assert np.mean(np.all(np.abs(band.astype(int) - np.array(colour[:3])) <= 3, axis=1)) < 0.001


def test_screenshot_range_and_colour_mode(qt_app: Any, tmp_path: Path) -> None:
    from explorer.gui.screenshot import render_screenshot

    whole = render_screenshot([BERT], tmp_path / "a.png", size=(1200, 800))
    zoomed = render_screenshot(
        [BERT], tmp_path / "b.png", size=(1200, 800), time_range=(10_000, 20_000), mode="opcode"
    )
    assert whole.bands.keys() == zoomed.bands.keys()
    assert not np.array_equal(_pixels(whole.path), _pixels(zoomed.path))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-m", "explorer.gui.launcher", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def test_cli_screenshot(tmp_path: Path) -> None:
    out = tmp_path / "llama.png"
    done = _cli(str(LLAMA_TP2), "--screenshot", str(out), "--range", "10us:60us", "--size", "1000x700")
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/profile", "--screenshot", "x.png"], "no such profile directory"),
        ([str(BERT), "--screenshot", "x.png", "--range", "5us"], "expected T0:T1"),
        ([str(BERT), "--screenshot", "x.png", "--range", "9us:2us"], "end must be after"),
        ([str(BERT), "--compare", "--screenshot", "x.png"], "exactly two"),
        ([str(BERT), "--screenshot", "x.png", "--size", "big"], "WIDTHxHEIGHT"),
        ([str(BERT), "--screenshot", "/no/such/dir/x.png"], "no such directory"),
        ([str(BERT), "--color-by", "mood"], "invalid choice"),
        ([], "no profile given"),
    ],
)
def test_cli_errors_are_one_line(args: list[str], message: str) -> None:
    done = _cli(*args)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert lines[0].startswith("neuron-explorer")
