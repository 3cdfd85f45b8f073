"""The built library targets the stable ABI, so one binary serves torch >= 2.10,
and uses no CPython API, so one binary serves every Python.

A binary that references at:: or c10:: symbols is tied to the exact torch it
was built with ("undefined symbol" after a torch upgrade); one that only uses
torch's C shim is not. A binary that references the CPython API is tied to
an interpreter ABI (and on free-threaded CPython an extension module that
does not declare itself GIL-free turns the GIL back on); lltm's is a plain
library that Python loads with torch.ops.load_library (lltm/_native.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import torch
from conftest import needed_libraries, undefined_symbols, unstable_symbols

import lltm
from lltm import _C

LIBRARY = _C.library


def test_library_is_no_extension_module():
    # lib/lltm_cpu.so: not beside the package's modules, and no interpreter tag.
    assert LIBRARY.parent.name == "lib" and LIBRARY.stem == "lltm_cpu", LIBRARY
    assert LIBRARY.suffix == (".dll" if sys.platform == "win32" else ".so"), LIBRARY


def test_no_python_symbols():
    symbols = undefined_symbols(LIBRARY)
    python = [s for s in symbols if s.startswith(("Py", "_Py"))]
    assert not python, python
    # Nor a library that would bring them: libpython, torch's Python bindings.
    needed = needed_libraries(LIBRARY)
    assert needed and not [n for n in needed if "python" in n], needed


def test_target_version_is_torch_2_10():
    assert _C.torch_target_version == "0x020a000000000000"


def test_no_unstable_torch_symbols():
    symbols = undefined_symbols(LIBRARY)
    # The parse works: the library does use torch's C shim.
    assert any(s.startswith("aoti_torch_") for s in symbols), symbols[:20]
    unstable = unstable_symbols(symbols)
    assert not unstable, "\n".join(unstable)


def test_unstable_symbol_filter():
    # What the filter must catch and let through (it also checks the CUDA
    # plugin in test_fallback.py).
    caught = [
        "at::Tensor::add(at::Tensor const&) const",
        "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)",
        "torch::jit::tracer::getTracingState()",
        "caffe2::TypeMeta::error_unsupported_typemeta(caffe2::TypeMeta)",
        "std::vector<c10::IValue, std::allocator<c10::IValue> >::reserve(unsigned long)",
    ]
    passed = ["aoti_torch_get_dim", "torch_call_dispatcher", "cudaLaunchKernel", "PyModule_Create2"]
    assert unstable_symbols(caught + passed) == caught


def _lltm_command(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "lltm", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_info_command():
    # "key  value" rows; keys may contain single spaces ("kernel [cpu]").
    rows = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in _lltm_command("info").splitlines()
    )
    assert rows["stable ABI target"] == "torch >= 2.10"
    assert rows["kernel [cpu]"] == "native"
    assert rows["lltm"] == lltm.__version__
    assert rows["torch"].startswith(torch.__version__)


def test_info_json_command():
    info = json.loads(_lltm_command("info", "--json"))
    assert info["torch_abi_target"] == "2.10"
    assert info["kernels"]["cpu"] == "native"
    assert info["lltm"] == lltm.__version__
    assert info["torch"] == torch.__version__
    assert isinstance(info["cuda_kernels_active"], bool)
