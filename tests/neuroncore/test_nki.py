"""NKI kernels on the core: each nki.language / nki.isa call against NumPy, the tutorial-style kernels
at small shapes, the constraint errors (one line naming the kernel line), timing, the import shim,
source links in a recorded profile, and ``python -m neuroncore.nki`` through its real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuroncore import nki
from neuroncore.nki import isa as nisa
from neuroncore.nki import language as nl
from neuroncore.nki import shim
from neuroncore.nki.api import ShapeSpec, run_kernel

RNG = np.random.default_rng(7)
HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def kernel_line(fn, text: str) -> int:
    """The line of ``fn``'s source that contains ``text`` (where an error must point)."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# -- numerics of each call ----------------------------------------------------------------------------


def test_load_store_copy_and_masks():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ip = nl.arange(128)[:, None]
        f = nl.arange(x.shape[1])[None, :]
        for t in nl.affine_range((x.shape[0] + 127) // 128):
            rows = t * 128 + ip
            tile = nl.load(x[rows, f], mask=rows < x.shape[0])
            nl.store(out[rows, f], value=nl.copy(tile), mask=rows < x.shape[0])
        return out

    x = rand(200, 96)
    np.testing.assert_array_equal(k(x), x)


def test_elementwise_broadcasting_and_reductions():
    @nki.jit
    def k(x, col):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((x.shape[0], 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        c = nl.load(col)
        y = nl.exp(t) * 2.0 - c  # ACTIVATE, TENSOR_SCALAR x2 (column operand)
        y = nl.maximum(y, t) + 1.0 / (nl.square(t) + 1.0)
        nl.store(out, value=y)
        stats = nl.ndarray((x.shape[0], 4), dtype=nl.float32)
        stats[:, 0:1] = nl.sum(t, axis=1)
        stats[:, 1:2] = nl.max(t, axis=1)
        stats[:, 2:3] = nl.mean(t, axis=1)
        stats[:, 3:4] = nl.min(t, axis=1)
        nl.store(red, value=stats)
        return out, red

    x, col = rand(128, 64), rand(128, 1)
    out, red = k(x, col)
    ref = np.maximum(np.exp(x) * 2.0 - col, x) + 1.0 / (x * x + 1.0)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        red, np.stack([x.sum(1), x.max(1), x.mean(1), x.min(1)], 1), rtol=1e-5, atol=1e-5
    )


def test_dtype_casts_round_to_bf16():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, value=nl.copy(t, dtype=nl.bfloat16))
        return out

    x = rand(16, 32)
    got = np.asarray(k(x), np.float32)
    bits = x.view(np.uint32)
    assert not np.array_equal(got, x)  # rounded
    assert np.all(np.abs(got - x) <= np.abs(x) * 2**-8 + 1e-30)
    assert np.all(got.view(np.uint32) & 0xFFFF == 0) and bits.size == got.size


def test_isa_matmul_accumulates_in_psum_and_transpose():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        tr = nl.ndarray((a.shape[1], 128), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((64, 256), nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(a.shape[0] // 128):
            at = nl.load(a[kt * 128 : (kt + 1) * 128, :])
            bt = nl.load(b[kt * 128 : (kt + 1) * 128, :])
            acc += nisa.nc_matmul(at, bt)
        nl.store(out, value=nl.copy(acc))
        first = nl.load(a[0:128, :])
        nl.store(tr, value=nl.copy(nisa.nc_transpose(first)))
        return out, tr

    a, b = rand(384, 64), rand(384, 256)
    out, tr = k(a, b)
    np.testing.assert_allclose(out, a.T @ b, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(tr, a[:128].T)


def test_new_style_isa_with_destinations():
    @nki.jit
    def k(x, y):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        xt = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        yt = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x)
        nisa.dma_copy(dst=yt, src=y)
        s = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=xt, data2=yt, op=nl.subtract)
        r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r, op=nl.add, data=s, axis=1)
        z = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=z, data=s, op0=nl.multiply, operand0=r, op1=nl.add, operand1=3.0)
        a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=a, op=nl.tanh, data=z, scale=0.5)
        m = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=m, value=2.0)
        nisa.tensor_tensor(dst=m, data1=m, data2=a, op=nl.multiply)
        nisa.dma_copy(dst=out, src=m)
        return out

    x, y = rand(32, 48), rand(32, 48)
    s = x - y
    ref = 2.0 * np.tanh(0.5 * (s * s.sum(1, keepdims=True) + 3.0))
    np.testing.assert_allclose(k(x, y), ref, rtol=1e-5, atol=1e-5)


def test_iota_affine_select_scan_and_where():
    @nki.jit
    def k(x):
        out = nl.ndarray((3, 8, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        g = nl.mgrid[0:8, 0:8]
        idx = nisa.iota(g.p * 8 + g.x, dtype=nl.float32)
        t = nl.load(x)
        low = nisa.affine_select(g.x <= g.p, t, -1.0)
        scan = nisa.tensor_tensor_scan(t, idx, initial=0.0, op0=np.multiply, op1=np.add)
        pick = nl.where(nl.greater(t, 0.0), t, idx)
        nl.store(out[0], value=low)
        nl.store(out[1], value=scan)
        nl.store(out[2], value=pick)
        return out

    x = rand(8, 8)
    out = k(x)
    idx = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_array_equal(out[0], np.where(np.tri(8, dtype=bool), x, -1.0))
    h = np.zeros(8, np.float32)
    scan = np.empty_like(x)
    for i in range(8):
        h = x[:, i] * h + idx[:, i]
        scan[:, i] = h
    np.testing.assert_allclose(out[1], scan, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[2], np.where(x > 0, x, idx))


def test_spmd_grid_and_program_id():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        t = nl.load(x[i * 64 : (i + 1) * 64, :])
        nl.store(out[i * 64 : (i + 1) * 64, :], value=t * float(nl.num_programs()))
        return out

    x = rand(256, 32)
    np.testing.assert_allclose(k[4](x), x * 4.0)


def test_torch_and_jax_arrays_in_and_out():
    torch = pytest.importorskip("torch")

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exp(nl.load(x)))
        return out

    t = torch.randn(16, 8)
    got = k(t)
    assert isinstance(got, torch.Tensor) and torch.allclose(got, torch.exp(t), atol=1e-6)
    jnp = pytest.importorskip("jax.numpy")
    j = jnp.ones((4, 4))
    assert np.allclose(np.asarray(k(j)), np.e)


# -- the tutorial-style kernels, small ------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples():
    shim.install()
    from neuroncore.nki.examples import layernorm, mamba, matmul

    return matmul, layernorm, mamba


def test_matmul_stages_compute_the_product_and_get_faster(examples):
    matmul, _, _ = examples
    a, b = rand(512, 256), rand(512, 1024)
    latency = {}
    for name, kernel in matmul.STAGES.items():
        kw = {"BM": 2, "BN": 2, "BK": 2} if name == "fully_optimized" else {}
        run = kernel.run(a, b, **kw)
        np.testing.assert_allclose(run.outputs, a.T @ b, rtol=1e-4, atol=2e-3)
        latency[name] = run.latency_ns
    assert latency["hoisted_loads"] < latency["tiled"]
    assert latency["blocked_free_dim"] < latency["hoisted_loads"]


def test_layernorm_kernels_with_a_partial_tile(examples):
    _, layernorm, _ = examples
    x, g, b = rand(200, 700), rand(700), rand(700)
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b
    for kernel in (layernorm.layernorm_v1, layernorm.layernorm_v2):
        np.testing.assert_allclose(kernel(x, 1e-5, g, b), ref, rtol=1e-4, atol=1e-4)


def test_mamba_kernels_agree_with_the_recurrence(examples):
    _, _, mamba = examples
    b, ch, sl, st = 1, 128, 1024, 2
    delta = RNG.random((b, ch, sl)).astype(np.float32) * 0.1
    u, A = rand(b, ch, sl), -RNG.random((ch, st)).astype(np.float32)
    B, C = rand(b, st, sl), rand(b, st, sl)
    ref = np.zeros((b, ch, sl), np.float32)
    for s in range(st):
        dA, dBu = np.exp(delta[0] * A[:, s : s + 1]), delta[0] * u[0] * B[0, s]
        h = np.zeros(ch, np.float32)
        for i in range(sl):
            h = dA[:, i] * h + dBu[:, i]
            ref[0, :, i] += h * C[0, s, i]
    assert np.abs(ref).max() > 0.1
    for kernel in (mamba.mamba_v1, mamba.mamba_v2, mamba.mamba_v3):
        np.testing.assert_allclose(kernel(delta, u, A, B, C), ref, rtol=1e-4, atol=1e-4)


# -- timing ----------------------------------------------------------------------------------------------


def test_sequential_range_iterations_do_not_overlap_affine_ones_do():
    def make(loop):
        @nki.jit
        def k(x):
            out = nl.ndarray((8, 128, 512), dtype=x.dtype, buffer=nl.shared_hbm)
            for i in loop(8):
                t = nl.load(x[i])
                nl.store(out[i], value=nl.exp(t))
            return out

        return k

    shape = [ShapeSpec((8, 128, 512), "float32")]
    affine = run_kernel(make(nl.affine_range).fn, shape, {})
    seq = run_kernel(make(nl.sequential_range).fn, shape, {})
    assert seq.latency_ns > 1.5 * affine.latency_ns


def test_timing_only_from_shapes_matches_a_numerics_run(examples):
    matmul, _, _ = examples
    a, b = rand(256, 128), rand(256, 512)
    real = matmul.matmul_tiled.run(a, b)
    shapes = matmul.matmul_tiled.run(ShapeSpec((256, 128), "float32"), ShapeSpec((256, 512), "float32"))
    assert shapes.outputs is None and shapes.latency_ns == real.latency_ns
    assert 0 < real.hfu < 1


def test_wide_contiguous_rows_load_faster_than_narrow_ones():
    """DMA efficiency comes from the access pattern: the same bytes in 256 B rows cost more."""

    def make(width):
        @nki.jit
        def k(x):
            for i in nl.affine_range(x.shape[1] // width):
                nl.load(x[0:128, i * width : (i + 1) * width])
            return None

        return k

    spec = [ShapeSpec((128, 4096), "bfloat16")]
    narrow = run_kernel(make(128).fn, spec, {})
    wide = run_kernel(make(2048).fn, spec, {})
    assert narrow.program.dma_bytes.sum() == wide.program.dma_bytes.sum()
    assert narrow.latency_ns > 1.5 * wide.latency_ns


def test_benchmark_reports_percentiles_from_the_cost_model():
    @nki.benchmark(warmup=1, iters=3)
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out

    k(rand(128, 64))
    p50 = k.benchmark_result.nc_latency.get_latency_percentile(50)
    assert p50 > 0 and p50 == pytest.approx(k.last_run.latency_us)


# -- constraint errors: one message naming the kernel file and line ---------------------------------------


def _error_of(kernel, *args):
    with pytest.raises(nki.NkiError) as info:
        kernel(*args)
    return str(info.value)


def test_partition_dim_over_128():
    @nki.jit
    def k(x):
        return nl.load(x)

    msg = _error_of(k, rand(256, 4))
    assert f"{HERE}:{kernel_line(k.fn, 'nl.load(x)')}" in msg and "128" in msg


def test_psum_tile_over_a_bank():
    @nki.jit
    def k(x):
        nl.zeros((128, 1024), nl.float32, buffer=nl.psum)
        return None

    msg = _error_of(k, rand(1, 1))
    assert f"{HERE}:{kernel_line(k.fn, 'nl.zeros')}" in msg and "PSUM bank" in msg


def test_stationary_and_moving_free_limits():
    @nki.jit
    def wide_stationary(a, b):
        return nisa.nc_matmul(nl.load(a), nl.load(b))

    msg = _error_of(wide_stationary, rand(128, 256), rand(128, 64))
    assert f"{HERE}:{kernel_line(wide_stationary.fn, 'nisa.nc_matmul')}" in msg
    assert "stationary free size 256" in msg

    @nki.jit
    def wide_moving(a, b):
        return nisa.nc_matmul(nl.load(a), nl.load(b))

    assert "moving free size 1024" in _error_of(wide_moving, rand(128, 64), rand(128, 1024))


def test_wrong_buffer_for_an_instruction():
    @nki.jit
    def matmul_from_hbm(a, b):
        return nisa.nc_matmul(a, nl.load(b))

    msg = _error_of(matmul_from_hbm, rand(128, 64), rand(128, 64))
    assert "stationary is in HBM" in msg and f":{kernel_line(matmul_from_hbm.fn, 'nc_matmul')}" in msg

    @nki.jit
    def exp_of_hbm(a):
        return nl.exp(a)

    assert "in HBM" in _error_of(exp_of_hbm, rand(8, 8))


def test_out_of_bounds_access():
    @nki.jit
    def k(x):
        return nl.load(x[0:128, 60:70])

    msg = _error_of(k, rand(128, 64))
    assert "out-of-bounds" in msg and f":{kernel_line(k.fn, 'x[0:128, 60:70]')}" in msg

    @nki.jit
    def unmasked(x):
        ip = nl.arange(128)[:, None]
        return nl.load(x[64 + ip, nl.arange(4)[None, :]])

    assert "no mask covers it" in _error_of(unmasked, rand(100, 4))


# -- import shim ------------------------------------------------------------------------------------------


def test_shim_resolves_both_import_styles_to_ours(tmp_path):
    script = tmp_path / "k.py"
    script.write_text(
        "import neuronxcc.nki.language as nl1\nimport nki.language as nl2\nimport nki.isa as nisa\n"
        "import neuronxcc.nki.typing as nt\nimport nki\n"
        "import neuroncore.nki.language as ours\n"
        "assert nl1 is ours and nl2 is ours and nisa.nc_matmul and nt.tensor\n"
        "assert nki.jit\nprint('shim ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "neuroncore.nki", str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "shim ok" in done.stdout, done.stderr


def test_a_real_install_wins(tmp_path):
    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    script = tmp_path / "k.py"
    script.write_text("import nki\nprint('real' if getattr(nki, 'REAL', False) else 'ours')\n")
    done = subprocess.run(
        [sys.executable, "-m", "neuroncore.nki", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.stdout.strip() == "real", done.stderr


# -- the command line ---------------------------------------------------------------------------------------

KERNEL_FILE = """
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

@nki.jit
def scale(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], value=t * 2.0)
    return out

@nki.jit
def broken(x, y):
    return nl.load(x)
"""


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "neuroncore.nki", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_cli_timing_only_json(tmp_path):
    path = tmp_path / "kern.py"
    path.write_text(KERNEL_FILE)
    done = _cli(f"{path}:scale", "--shapes", "512x256,1x1", "--dtype", "bf16", "--timing-only", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["latency_us"] > 0 and figures["hfu"] == 0 and figures["dma_transfers"] == 8


def test_cli_errors_are_one_line(tmp_path):
    path = tmp_path / "kern.py"
    path.write_text(KERNEL_FILE)
    done = _cli(f"{path}:broken", "--shapes", "512x4,1x1", "--timing-only")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and f"{path}:15" in done.stderr
    missing = _cli(f"{path}:nothere", "--shapes", "1x1", "--timing-only")
    assert missing.returncode == 2 and "no kernel 'nothere'" in missing.stderr
    bad = _cli(f"{path}:scale", "--shapes", "12xz", "--timing-only")
    assert bad.returncode == 2 and "--shapes" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_shapes_that_do_not_fit_the_kernel_are_one_line(tmp_path):
    """Fewer --shapes than the kernel's arguments, or a --set name it does not take: one line naming
    the kernel's parameters, not a TypeError traceback from the kernel call."""
    path = tmp_path / "kern.py"
    path.write_text(KERNEL_FILE)
    few = _cli(f"{path}:scale", "--shapes", "512x256", "--timing-only")
    assert few.returncode == 2 and "Traceback" not in few.stderr
    assert len(few.stderr.strip().splitlines()) == 1 and "scale(x, y)" in few.stderr and "'y'" in few.stderr
    unknown = _cli(f"{path}:scale", "--shapes", "512x256,1x1", "--set", "z=1", "--timing-only")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    assert "'z'" in unknown.stderr and "Traceback" not in unknown.stderr


# -- profiles linked to kernel lines ----------------------------------------------------------------------


def test_profile_instructions_carry_kernel_lines(tmp_path):
    from collectors.device_profile import DeviceProfileCollector
    from formats.read_api import open_profile
    from neuroncore.events import EventSink

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        y = nl.exp(t)
        nl.store(out, value=y)
        return out

    sink = EventSink()
    collector = DeviceProfileCollector(tmp_path / "prof")
    sink.subscribe(collector)
    run_kernel(k.fn, [rand(128, 64)], {}, sink=sink)
    collector.close()
    found = sorted((tmp_path / "prof").rglob("Instruction*.parquet"))
    assert found
    profile = open_profile(found[0].parent)
    table = profile.table("Instruction", ["opcode", "nki_source_location", "stack_frame_ids"]).to_pylist()
    rows = [(r["opcode"], r["nki_source_location"], r["stack_frame_ids"]) for r in table]
    locs = {r[0]: r[1] for r in rows}
    assert locs["ACTIVATE"] == f"{HERE}:{kernel_line(k.fn, 'nl.exp(t)')}"
    assert locs["WRITE"] is not None and all(r[2] for r in rows if r[1])
    # per-line time and instruction counts, as the terminal viewer and the GUI show kernel source
    from formats.read_api import attribute

    lines = {(lt.file, lt.line): lt for lt in attribute(profile).lines.values()}
    exp_line = lines[(str(HERE), kernel_line(k.fn, "nl.exp(t)"))]
    assert exp_line.self_ns > 0 and exp_line.instructions == 1 and exp_line.function == "k"
    kernel_frame = [lt for (f, n), lt in lines.items() if f == str(HERE) and lt.function == "k"]
    assert len(kernel_frame) >= 3  # load, exp, store lines


def test_nki_profile_writes_one_of_our_profiles(tmp_path):
    script = tmp_path / "p.py"
    script.write_text(
        "import numpy as np\nfrom neuroncore import nki\nimport neuroncore.nki.language as nl\n"
        f"@nki.profile(working_directory={str(tmp_path / 'prof')!r}, save_trace_name='double')\n"
        "def double(x):\n"
        "    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, value=nl.load(x) * 2.0)\n"
        "    return out\n"
        "print(float(double(np.ones((128, 64), np.float32)).sum()))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "16384.0" in done.stdout, done.stderr
    found = sorted((tmp_path / "prof" / "double").rglob("Instruction*.parquet"))
    assert found, sorted(p.name for p in (tmp_path / "prof").rglob("*"))
    from formats.read_api import open_profile

    table = open_profile(found[0].parent).table("Instruction", ["nki_source_location"]).to_pylist()
    assert any(str(script) + ":7" == r["nki_source_location"] for r in table)


def test_neuron_profile_capture_of_a_kernel_file(tmp_path):
    """``neuron-profile capture -- python -m neuroncore.nki FILE``: the unchanged file's kernel call is
    recorded, its instructions linked to the kernel lines."""
    path = tmp_path / "kern.py"
    path.write_text(
        KERNEL_FILE + "\nimport numpy as np\nprint(float(scale(np.ones((256, 8), np.float32), 0).sum()))\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "explorer.profile_cli",
            "capture",
            "-o",
            str(tmp_path / "out"),
            "--",
            sys.executable,
            "-m",
            "neuroncore.nki",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "4096.0" in done.stdout, done.stderr
    found = sorted((tmp_path / "out" / "device").rglob("Instruction*.parquet"))
    assert found
    from formats.read_api import open_profile

    table = open_profile(found[0].parent).table("Instruction", ["opcode", "nki_source_location"]).to_pylist()
    assert {f"{path}:10"} <= {r["nki_source_location"] for r in table}


def test_a_kernel_replaces_a_layer_inside_a_traced_torch_model():
    """``neuroncore.trace`` of a module that calls an NKI kernel: the kernel's instructions join the
    compiled program (with their kernel lines) and its values come out right."""
    torch = pytest.importorskip("torch")
    import neuroncore as nc

    @nki.jit
    def gelu_twice(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128 : (i + 1) * 128, :])
            nl.store(out[i * 128 : (i + 1) * 128, :], value=nl.gelu(t) * 2.0)
        return out

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

        def forward(self, x):
            return self.fc2(gelu_twice(self.fc1(x)))

    model, x = Mlp().eval(), torch.randn(256, 64)
    traced = nc.trace(model, (x,), instance="trn1.2xlarge")
    y = traced(x)
    ref = model.fc2(torch.nn.functional.gelu(model.fc1(x)) * 2.0)
    assert (y - ref).abs().max().item() < 1e-4
    program = traced.last_result.program
    line = f"{HERE}:{kernel_line(gelu_twice.fn, 'nl.gelu(t)')}"
    opcodes = {
        program.opcodes[program.opcode_id[i]]
        for i, loc in enumerate(program.nki_source_location)
        if loc == line
    }
    assert "ACTIVATE" in opcodes
    assert any(op.opcode == "nki_kernel" for op in program.graph.ops)


def test_a_kernel_replaces_a_layer_inside_a_traced_jax_function():
    """``neuroncore.trace`` of a JAX function that calls an NKI kernel: the call is one custom call in
    the HLO, the same ``nki_kernel`` op a PyTorch call becomes, with the kernel lines on its
    instructions and the values of the function with the kernel's math written in jax.numpy."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import neuroncore as nc

    @nki.jit
    def tanh_plus_one(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128 : (i + 1) * 128, :])
            nl.store(out[i * 128 : (i + 1) * 128, :], value=nl.tanh(t) + 1.0)
        return out

    rng = np.random.default_rng(3)
    w1 = jnp.asarray(rng.standard_normal((64, 96)).astype(np.float32) * 0.2)
    w2 = jnp.asarray(rng.standard_normal((96, 32)).astype(np.float32) * 0.2)

    def mlp(x):
        return tanh_plus_one(x @ w1) @ w2

    x = jnp.asarray(rng.standard_normal((256, 64)).astype(np.float32))
    traced = nc.trace(mlp, (x,), instance="trn1.2xlarge")
    y = np.asarray(traced(x))
    ref = np.asarray((jnp.tanh(x @ w1) + 1.0) @ w2)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    program = traced.last_result.program
    assert any(op.opcode == "nki_kernel" for op in program.graph.ops)
    line = f"{HERE}:{kernel_line(tanh_plus_one.fn, 'nl.tanh(t)')}"
    assert line in set(program.nki_source_location)


def test_matmul_without_transpose_x_transpose_and_softmax():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((a.shape[0], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        sm = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        tr = nl.ndarray((a.shape[1], a.shape[0]), dtype=nl.float32, buffer=nl.shared_hbm)
        at = nl.load(a)
        nl.store(out, value=nl.copy(nl.matmul(at, nl.load(b))))  # a [M, K] is transposed on the PE first
        nl.store(sm, value=nl.softmax(at, axis=1))
        nl.store(tr, value=nl.copy(nl.transpose(at)))
        return out, sm, tr

    a, b = rand(64, 128), rand(128, 96)
    out, sm, tr = k(a, b)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(tr, a.T)
