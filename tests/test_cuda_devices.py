"""Per-device choice of kernels: a GPU the CUDA plugin has no code for.

The plugin is compiled for a list of architectures (plus PTX of the newest);
on a GPU outside it whose driver cannot compile that PTX, its kernels cannot
run. lltm asks the plugin once per device and routes that device's tensors to
the composite kernels, with one warning; `lltm info` says it per device.

The decision is tested here against a stand-in for the plugin's native
module (the plugin is lltm's own code; torch is untouched); the end-to-end
test builds a plugin without code for the GPU at hand and needs one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from lltm import _backends, info

ROOT = Path(__file__).resolve().parents[1]


class _FakeNative:
    """What lltm reads from a loaded plugin's `_C`: its architectures and its
    answer per device (device 1: no code for it)."""

    cuda_archs = "7.5/8.0/9.0+PTX"

    def __init__(self):
        self.asked = []

    def kernel_image_problem(self, index):
        self.asked.append(index)
        return "no code for this GPU (sm_61): no kernel image is available" if index == 1 else ""


@pytest.fixture
def loaded_plugin(monkeypatch):
    native = _FakeNative()
    status = _backends.PluginStatus(
        loaded=True, module="lltm_cuda13", reason="lltm_cuda13 loaded", fix=None
    )
    monkeypatch.setattr(_backends, "PLUGIN", status)
    monkeypatch.setitem(sys.modules, "lltm_cuda13._C", native)
    monkeypatch.setattr(_backends, "_device_problems", {})
    return native


def test_each_device_is_asked_once_and_warned_about_once(loaded_plugin):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _backends.fused_kernels_run_on(0)
        assert not _backends.fused_kernels_run_on(1)
        assert not _backends.fused_kernels_run_on(1)
        assert _backends.fused_kernels_run_on(0)
    assert loaded_plugin.asked == [0, 1]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "lltm_cuda13 cannot run on cuda:1: no code for this GPU (sm_61)" in messages[0]
    assert "composite PyTorch implementation" in messages[0]
    assert "TORCH_CUDA_ARCH_LIST (this one has 7.5;8.0;9.0+PTX)" in messages[0]


def test_without_a_loaded_plugin_nothing_is_routed(monkeypatch):
    status = _backends.PluginStatus(loaded=False, module=None, reason="not installed", fix="x")
    monkeypatch.setattr(_backends, "PLUGIN", status)
    monkeypatch.setattr(_backends, "_device_problems", {})
    # The dispatcher already sends CUDA tensors to the composite kernels.
    assert _backends.fused_kernels_run_on(0)


def test_info_says_which_kernels_serve_each_device():
    facts = info.collect()
    facts.update(
        cuda_devices=["GPU A", "GPU B"],
        cuda_device_problems=["", "no code for this GPU (sm_61): no kernel image is available"],
    )
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in info.render(facts).splitlines()}
    assert rows["cuda:0"] == "GPU A: fused kernels"
    assert rows["cuda:1"].startswith("GPU B: composite kernels (no code for this GPU (sm_61)")


def test_info_shows_how_sequences_run_on_each_device():
    facts = info.collect()
    path = {
        "forward": "persistent, clusters: 8 groups x 16 blocks (...)",
        "backward": "per-step (x)",
    }
    facts.update(
        cuda_devices=["GPU A"],
        cuda_device_problems=[""],
        cuda_sequence_paths=[{"16x128 16-bit": path}],
    )
    lines = info.render(facts).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("sequence 16x128 16-bit cuda:0"))
    assert lines[at].endswith("forward persistent, clusters: 8 groups x 16 blocks (...)")
    assert lines[at + 1].strip() == "backward per-step (x)"
    assert info.SEQUENCE_SIZES == ((16, 128), (8, 256), (64, 512))


def test_info_asks_the_plugin_for_float32_and_16_bit_sequences(monkeypatch):
    # Each size in float32 and in 16 bits (the element size the rule plans
    # by: autocast's bf16 and fp16 alike), keyed by both.
    asked = []

    def sequence_path(index, dtype, batch, state):
        asked.append((index, dtype, batch, state))
        return {"forward": f"{dtype}", "backward": f"{batch}x{state}"}

    monkeypatch.setattr(_backends, "device_problem", lambda index: "")
    monkeypatch.setattr(_backends, "sequence_path", sequence_path)
    paths = info._sequence_paths(1)
    sizes = info.SEQUENCE_SIZES
    assert asked == [(1, torch.float32, b, s) for b, s in sizes] + [
        (1, torch.bfloat16, b, s) for b, s in sizes
    ]
    assert paths["8x256 16-bit"] == {"forward": "torch.bfloat16", "backward": "8x256"}
    assert paths["64x512 float32"] == {"forward": "torch.float32", "backward": "64x512"}
    assert len(paths) == 2 * len(sizes)


def test_the_sequence_path_without_a_plugin_is_unknown(monkeypatch):
    status = _backends.PluginStatus(loaded=False, module=None, reason="not installed", fix="x")
    monkeypatch.setattr(_backends, "PLUGIN", status)
    assert _backends.sequence_path(0, torch.float32, 16, 128) is None


# --- On a GPU ---------------------------------------------------------------------------

_SCRIPT = textwrap.dedent(
    """
    import warnings, torch
    warnings.simplefilter("always")
    import lltm
    from lltm import _backends, reference
    assert _backends.PLUGIN.loaded, _backends.PLUGIN
    inputs = reference.example_inputs(5, 3, 8, dtype=torch.float32, device="cuda")
    leaves = [t.requires_grad_() for t in inputs]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new_h, new_cell = lltm.lltm_cell(*leaves)
        (new_h.sum() + new_cell.sum()).backward()
    expected = reference.lltm_cell(*[t.detach().cpu().double() for t in inputs])
    torch.testing.assert_close(new_h.double().cpu(), expected[0], rtol=1e-4, atol=1e-4)
    assert any("cannot run on cuda:0" in str(w.message) for w in caught), caught
    print("composite on", torch.cuda.get_device_name(0))
    """
)


@pytest.mark.cuda
@pytest.mark.slow
def test_gpu_without_code_runs_the_composite_kernels(tmp_path):
    if not torch.cuda.is_available() or torch.version.cuda is None:
        pytest.skip("needs a CUDA device and a CUDA build of torch")
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("needs nvcc to build a plugin for another GPU")
    major, minor = torch.cuda.get_device_capability(0)
    # Code (no PTX) for one architecture that is not this GPU's.
    other = "7.5" if (major, minor) != (7, 5) else "8.0"
    build = tmp_path / "build"
    env = {
        **os.environ,
        "LLTM_VARIANT": "cuda",
        "TORCH_CUDA_ARCH_LIST": other,
        "CUDA_HOME": os.environ.get("CUDA_HOME", "/usr/local/cuda"),
    }
    subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(build), "--build-temp",
         str(tmp_path / "temp")],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=1200,
    )  # fmt: skip
    (library,) = build.glob("lltm_cuda*/lib/lltm_cuda.*")
    package = tmp_path / "site" / library.parent.parent.name
    (package / "lib").mkdir(parents=True)
    shutil.copy(library, package / "lib" / library.name)
    for module in ("__init__.py", "_C.py"):
        shutil.copy(ROOT / "src" / "lltm_cuda" / module, package / module)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
