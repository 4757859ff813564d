"""`neuroncore check script.py[:function]`: operator coverage from the command line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuroncore.cli import main

REPO = Path(__file__).resolve().parents[2]

SUPPORTED = """
import jax, jax.numpy as jnp

def mlp(x):
    return jax.nn.gelu(x @ jnp.ones((8, 16))) @ jnp.ones((16, 4))

def build():
    return mlp, (jnp.ones((2, 8)),)
"""

UNSUPPORTED = """
import jax, jax.numpy as jnp

def model(x):
    y = jnp.fft.rfft(x).real          # an FFT: not on the core
    return jnp.cumsum(y, axis=-1) * 2.0

def make():
    return model, [jnp.ones((4, 8))]
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_all_supported_exits_zero(tmp_path, capsys):
    path = _script(tmp_path, SUPPORTED)
    assert main(["check", str(path)]) == 0
    assert "all ops supported" in capsys.readouterr().out


def test_unsupported_ops_are_listed_with_source_and_exit_one(tmp_path):
    path = _script(tmp_path, UNSUPPORTED)
    proc = subprocess.run([sys.executable, "-m", "neuroncore.cli", "check", f"{path}:make"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stderr
    assert "fft" in proc.stdout
    assert "model.py:5" in proc.stdout  # the jnp.fft.rfft line
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text,target_suffix,message", [
    ("def build():\n    return 1\n", "", "must return (model_or_function, example_inputs)"),
    ("x = 1\n", ":nothere", "defines no function 'nothere'"),
    ("raise RuntimeError('boom')\n", "", "failed to run: RuntimeError: boom"),
    ("def build():\n    return (lambda x: x), ([1, 2],)\n", "", "torch tensors or JAX arrays"),
])
def test_bad_targets_give_one_line_and_exit_two(tmp_path, capsys, text, target_suffix, message):
    path = tmp_path / "bad.py"
    path.write_text(text)
    assert main(["check", f"{path}{target_suffix}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("neuroncore: error:") and message in err[0]


def test_missing_script(capsys):
    assert main(["check", "/no/such/model.py"]) == 2
    assert "no such script" in capsys.readouterr().err


def test_frontend_is_found_inside_nested_inputs():
    import jax.numpy as jnp

    from neuroncore.frontends import frontend_for

    module = frontend_for(({"x": [jnp.ones(2)]},))
    assert module.__name__.endswith("jax_frontend")
    with pytest.raises(ValueError, match="got int"):
        frontend_for(({"x": 1},))


def test_piped_output_is_never_cut(tmp_path):
    """Not a terminal (and no COLUMNS): rich used to cut the layer and file:line columns at 80."""
    folder = tmp_path / ("a_rather_long_project_folder_name_" * 3)
    folder.mkdir()
    path = _script(folder, UNSUPPORTED)
    proc = subprocess.run([sys.executable, "-m", "neuroncore.cli", "check", f"{path}:make"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    fft_line = next(line for line in proc.stdout.splitlines() if line.startswith("fft"))
    assert fft_line.split()[2] == "model/fft" and fft_line.endswith(f"{path}:5")  # whole, on one line
    assert "…" not in proc.stdout


def test_check_results_print_layer_and_line():
    import neuroncore as nc

    namespace: dict[str, object] = {}
    exec(compile(textwrap.dedent(UNSUPPORTED), "model.py", "exec"), namespace)
    model, examples = namespace["make"]()  # type: ignore[operator]
    missing = nc.check(model, examples)
    fft = next(op for op in missing if op.opcode == "fft")
    assert str(fft) == f"{fft.name} (fft) at model/fft [model.py:5]"
    assert f"{fft.name} (fft) at model/fft [model.py:5]" in repr(missing)  # print(nc.check(...))
    assert fft.shape == (4, 5) and fft.layer == "model/fft" and fft.source == "model.py:5"


TORCH_PARTLY = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(self.conv(x).mean(dim=(2, 3)))
        return torch.lgamma(y)  # not on the core

def build():
    return Net(), {"x": torch.ones(1, 3, 8, 8)}
"""


def test_coverage_table_counts_supported_and_unsupported_ops(tmp_path):
    """Piped: one line per unsupported op (op, name, layer, file:line), then the coverage table
    (every opcode, its count, its status), every cell whole; keyword example inputs work."""
    pytest.importorskip("torch")
    path = _script(tmp_path, TORCH_PARTLY)
    proc = subprocess.run([sys.executable, "-m", "neuroncore.cli", "check", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "1 unsupported op (torch)"
    op_line = next(line for line in lines if line.startswith("aten.lgamma "))
    assert op_line.split()[2] == "model" and op_line.endswith(f"{path}:12")
    title = next(line for line in lines if line.startswith("coverage (torch):"))
    assert title.endswith("1 unsupported (1 kind)")
    rows = {line.split()[0]: line.split()[1:] for line in lines[lines.index(title) + 2:]}
    assert rows["dot"] == ["1", "supported"]  # the linear
    assert rows["convolution"] == ["1", "supported"]
    assert rows["aten.lgamma"] == ["1", "UNSUPPORTED"]
    assert sum(int(count) for count, _ in rows.values()) == int(title.split()[2])


def test_coverage_api_and_all_supported_exit(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import neuroncore as nc
    from neuroncore.frontends.tracing import coverage

    result = coverage(torch.nn.Conv1d(2, 3, 3), (torch.ones(1, 2, 8),))
    assert result.unsupported == () and all(r.supported for r in result.rows)
    assert {r.opcode for r in result.rows} >= {"convolution", "reshape"}
    assert nc.check(torch.nn.Conv1d(2, 3, 3), (torch.ones(1, 2, 8),)) == []
    path = _script(tmp_path, "import torch\n\ndef build():\n"
                             "    return torch.nn.Conv1d(2, 3, 3), (torch.ones(1, 2, 8),)\n")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "all ops supported" in out and "coverage (torch)" in out


MISMATCHED = """
import torch

def build():
    return torch.nn.Linear(4, 4), (torch.randn(2, 5),)
"""


def test_a_shape_error_in_the_model_is_one_line(tmp_path):
    """Example inputs of the wrong size stop ``torch.export`` in the fake tensor mode, which logged
    a 19-line traceback of the same error to stderr before the one line (found by the user trials)."""
    pytest.importorskip("torch")
    path = _script(tmp_path, MISMATCHED)
    proc = subprocess.run([sys.executable, "-m", "neuroncore.cli", "check", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "neuroncore: error: Linear: torch.export failed: a and b must have same reduction dim, "
        "but got [2, 5] X [4, 4]."]
