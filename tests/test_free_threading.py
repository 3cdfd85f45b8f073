"""lltm's first use from many threads at once, as free-threaded CPython runs it.

lltm's lazy state is set up on first use: the library loads and the CUDA
plugin is looked for when lltm is first imported, the C++ kernels choose
their instruction set and kernels at their first call (function-local
statics), a device the plugin cannot serve is probed once and warned about
once, and the composite kernels warn once per device type. Without a GIL
nothing serialises those first uses but lltm's own code (the import lock,
C++'s thread-safe statics, locks in lltm/_backends.py).

Each test starts a fresh interpreter, so that the first use really is the
first, and releases many threads into it at once with a barrier. On an
interpreter with a GIL, a switch interval of a microisecond makes the threads
interleave as often as the interpreter allows; on a free-threaded one
(CPython 3.14t, in the wheels workflow) they run in parallel, and the test
also checks that importing lltm left the GIL disabled (lltm loads no
extension module that would turn it back on).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

THREADS = 16

_PRELUDE = """
import json, sys, sysconfig, threading
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
if not FREE_THREADED:
    sys.setswitchinterval(1e-6)
barrier = threading.Barrier({threads})
results, errors = [], []

def in_threads(body):
    def run(i):
        try:
            barrier.wait()
            results.append(body(i))
        except BaseException as error:  # reported, not lost in the thread
            errors.append(f"{{type(error).__name__}}: {{error}}")
    threads = [threading.Thread(target=run, args=(i,)) for i in range({threads})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

def report(**facts):
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(json.dumps({{"free_threaded": FREE_THREADED, "gil_enabled": gil,
                       "errors": errors, **facts}}))
"""


def _run(body: str) -> dict:
    script = _PRELUDE.format(threads=THREADS) + textwrap.dedent(body)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["errors"] == [], report["errors"]
    if report["free_threaded"]:
        assert not report["gil_enabled"], "importing lltm turned the GIL back on"
    return report


def test_first_import_and_kernel_calls_from_many_threads():
    # Every thread imports lltm (one of them loads the library and registers
    # the ops, the others wait for it), then runs the kernels for the first
    # time: the instruction set and the span and fused-step kernels are chosen
    # concurrently, and every result must still be the reference's.
    report = _run(
        """
        def body(i):
            import torch
            import lltm
            from lltm import _C, info, reference
            x, w, b, h, c = reference.example_inputs(3 + i % 4, 5, 7 + i % 3)
            new_h, new_c = lltm.lltm_cell(x, w, b, h, c)
            ref_h, ref_c = reference.lltm_cell(x, w, b, h, c)
            torch.testing.assert_close(new_h, ref_h, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(new_c, ref_c, rtol=1e-12, atol=1e-12)
            seq = torch.randn(4, x.shape[0], x.shape[1], dtype=x.dtype)
            output, _ = lltm.lltm_sequence(seq, w, b, h, c)
            state = (h, c)
            for t in range(seq.shape[0]):
                state = reference.lltm_cell(seq[t], w, b, *state)
            torch.testing.assert_close(output[-1], state[0], rtol=1e-12, atol=1e-12)
            facts = info.collect()
            return [_C.cpu_isa(), facts["cpu_isa"], facts["kernels"]["cpu"]]

        in_threads(body)
        import lltm
        report(answers=results, isa=lltm._C.cpu_isa())
        """
    )
    assert len(report["answers"]) == THREADS
    assert all(a == [report["isa"], report["isa"], "native"] for a in report["answers"]), report


def test_each_device_is_probed_and_warned_about_once():
    # lltm's per-device fallback asks the CUDA plugin about each device once,
    # however many threads ask at once. The plugin's native module is stood
    # in for here (no GPU): its probe takes a while, as creating a context
    # does, so that the other threads ask meanwhile.
    report = _run(
        """
        import time, warnings
        import lltm
        from lltm import _backends

        class Native:
            cuda_archs = "9.0+PTX"
            def __init__(self):
                self.asked = []
            def kernel_image_problem(self, index):
                self.asked.append(index)
                time.sleep(0.05)
                return "no code for this GPU (sm_61)" if index == 1 else ""

        native = Native()
        sys.modules["lltm_cuda13._C"] = native
        _backends.PLUGIN = _backends.PluginStatus(
            loaded=True, module="lltm_cuda13", reason="loaded", fix=None)
        shown = []
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        in_threads(lambda i: _backends.fused_kernels_run_on(i % 2))
        report(answers=results, asked=sorted(native.asked), warnings=shown)
        """
    )
    assert sorted(report["answers"]) == [False] * (THREADS // 2) + [True] * (THREADS // 2)
    assert report["asked"] == [0, 1], report
    assert len(report["warnings"]) == 1 and "cannot run on cuda:1" in report["warnings"][0]


def test_composite_kernels_warn_once_per_device_type():
    report = _run(
        """
        import warnings
        import torch
        from lltm import _backends

        shown = []
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        devices = [torch.device("xpu"), torch.device("mps")]
        in_threads(lambda i: _backends._warn_composite(devices[i % 2]))
        report(warnings=sorted(shown))
        """
    )
    warned = report["warnings"]
    assert len(warned) == 2, warned
    assert "native mps kernel" in warned[0] and "native xpu kernel" in warned[1]
