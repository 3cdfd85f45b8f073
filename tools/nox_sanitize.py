"""What ``nox -s sanitize`` builds and runs: lltm's kernels under AddressSanitizer and UBSan.

The CPU library is built from a copy of the source tree (its own build
tree: the checkout's in-place build stays as it is) with sanitizers.FLAGS and
installed into the session's environment; the CUDA sources built for the host
(tests/cuda_host/) take the same flags through LLTM_CUDA_HOST_CFLAGS, into a
build folder of their own. Both run in interpreters started with the
sanitizers' runtimes preloaded (:func:`environment`;
tools/setup_helpers/sanitizers.py says why), where any report stops the
process: a test that fails, with the report on stderr.
"""

from __future__ import annotations

import os
import platform

import nox

from tools.setup_helpers import sanitizers

# LLTM_CPU_ISA's names on each processor, narrowest first (csrc/cpu/isa.h).
ISAS = {"x86_64": ("baseline", "avx2", "avx512"), "aarch64": ("baseline", "neon")}


def compiler() -> str:
    """The C++ compiler the builds use: $CXX, else c++."""
    return os.environ.get("CXX", "c++")


def environment(session: nox.Session) -> dict[str, str]:
    """LD_PRELOAD, ASAN_OPTIONS and UBSAN_OPTIONS of an interpreter that runs
    the sanitized builds (sanitizers.environment over what this process has)."""
    runtimes = sanitizers.compiler_runtimes(compiler())
    if runtimes is None:
        names = " and ".join(sanitizers.COMPILER_RUNTIMES)
        session.error(
            f"{compiler()} cannot link the sanitizers: it has no {names} "
            "(Debian: the libasan and libubsan packages of its GCC)"
        )
    variables = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")
    env = sanitizers.environment(runtimes, {k: os.environ[k] for k in variables if k in os.environ})
    return {k: env[k] for k in variables}


# The optimisation of the sanitized builds: ASan's instrumentation makes
# -O3's compile of the sequence kernels three times as long as -O1's (six
# minutes of CPU for one file against two), and -O1 keeps the kernels' own
# code, their explicit SIMD included (only the compiler's own vectorisation
# of the plain loops is left out).
OPTIMISATION = "-O1"


def flags() -> list[str]:
    """The flags of the sanitized builds."""
    return [*sanitizers.FLAGS, OPTIMISATION]


def build_environment() -> dict[str, str]:
    """CFLAGS and LDFLAGS of the sanitized CPU build, after the environment's
    own (setup.py leaves out its -O3 where CFLAGS asks for a sanitizer and
    has a level)."""
    return {
        "CFLAGS": " ".join([os.environ.get("CFLAGS", ""), *flags()]).strip(),
        "LDFLAGS": " ".join([os.environ.get("LDFLAGS", ""), sanitizers.FLAGS[0]]).strip(),
    }


def isas(session: nox.Session, env: dict[str, str]) -> list[str]:
    """The instruction sets lltm's installed CPU library runs on this machine,
    narrowest first: those it reports running when LLTM_CPU_ISA asks for them."""
    names = ISAS.get(platform.machine().lower(), ("baseline",))
    found = []
    for name in names:
        ran = session.run(
            "python", "-c", "from lltm import _C; print(_C.cpu_isa())",
            env={**env, "LLTM_CPU_ISA": name}, silent=True,
        ).strip().splitlines()[-1]  # fmt: skip
        if ran == name:
            found.append(name)
    return found
