"""Which Pythons and torch releases the nox sessions run under.

The test matrix covers both ends of what lltm claims, CPython >= 3.10 and
torch >= 2.10: the suite runs under the oldest torch with the oldest Python,
the newest torch with the newest Python, and the local CPU build of torch in
between (``tests``); under the newest of both it runs against the wheel built
under the oldest Python against the oldest torch, unchanged (``compat``); the
error and core tests run under every release between the ends (``between``);
the CUDA plugin built against its CUDA torch loads under the newest torch's
CUDA build (``cibuildwheel``). Knobs (environment variables):

    LLTM_OLDEST_TORCH  the oldest torch lltm claims        (default: 2.10.0)
    LLTM_NEWEST_TORCH  the newest torch release, moved when torch releases
                                                           (default: 2.15.0)
    LLTM_BETWEEN_TORCH the releases between them, comma-separated
                                            (default: 2.11.0,2.12.1,2.14.1)
    LLTM_OLDEST_PYTHON, LLTM_NEWEST_PYTHON                 (default: 3.10, 3.13)
    LLTM_BUILD_TORCH   torch the CPU wheel of bench, fuzz, examples, ... is
                       built against (default: 2.13.0, the local CPU build)
    LLTM_CUDA_TORCH    CUDA build of torch for the CUDA variant (default: 2.14.1)

and, for CI runners with more Pythons and torch releases than a developer
machine, a full product instead of the pairs above:

    LLTM_NOX_PYTHONS   comma-separated Pythons   (default: 3.11; its first is
                       also the Python of the single sessions: lint, bench, ...)
    LLTM_NOX_TORCH     comma-separated torch versions
"""

from __future__ import annotations

import os


def env_list(name: str, default: str) -> list[str]:
    """The comma-separated list the environment variable ``name`` holds, else ``default``'s."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


PYTHONS = env_list("LLTM_NOX_PYTHONS", "3.11")
OLDEST_TORCH = os.environ.get("LLTM_OLDEST_TORCH", "2.10.0")
NEWEST_TORCH = os.environ.get("LLTM_NEWEST_TORCH", "2.15.0")
BETWEEN_TORCH = env_list("LLTM_BETWEEN_TORCH", "2.11.0,2.12.1,2.14.1")
OLDEST_PYTHON = os.environ.get("LLTM_OLDEST_PYTHON", "3.10")
NEWEST_PYTHON = os.environ.get("LLTM_NEWEST_PYTHON", "3.13")
BUILD_TORCH = os.environ.get("LLTM_BUILD_TORCH", "2.13.0")
CUDA_TORCH = os.environ.get("LLTM_CUDA_TORCH", "2.14.1")

# (Python, torch) pairs of the tests session. torch 2.15 has no wheel for
# Python 3.10, and the ends of the two ranges meet there: oldest with oldest
# here, newest with newest in compat, which runs the suite against the wheel
# a release ships (built at the oldest end) rather than a build of its own.
# Besides the local CPU build, these are PyPI's CUDA builds (several GB with
# their CUDA libraries; 2.14.1's lie in a local mirror on the development
# machines).
if "LLTM_NOX_PYTHONS" in os.environ or "LLTM_NOX_TORCH" in os.environ:
    TEST_MATRIX = [
        (python, torch)
        for python in PYTHONS
        for torch in env_list("LLTM_NOX_TORCH", f"{OLDEST_TORCH},{BUILD_TORCH},{NEWEST_TORCH}")
    ]
else:
    TEST_MATRIX = [(OLDEST_PYTHON, OLDEST_TORCH), (PYTHONS[0], BUILD_TORCH)]

# Which sessions of nox -t tests run under which Pythons.
TESTS_PYTHONS = sorted({python for python, _ in TEST_MATRIX} | {PYTHONS[0]})  # tests, slow
COMPAT_PYTHONS = sorted({OLDEST_PYTHON, NEWEST_PYTHON})

# pytest-xdist's workers for the suites of nox -t tests: one per core (the
# tests are mostly single-threaded: Python, subprocesses, small tensors).
# LLTM_TEST_WORKERS=0 runs them in pytest's own process.
TEST_WORKERS = ("-n", os.environ.get("LLTM_TEST_WORKERS", "auto"))
# The suite of the test sessions: not the slow tests (nox -s slow) nor the
# whole deployment product (nox -s deploy).
SUITE = "not slow and not deploy_full"
# What every session's pytest adds to its log: the slowest tests (where a
# suite's minutes go) and, on CI (CI set, as .ci/run and GitHub set it),
# what a test's process writes to its file descriptors uncaptured: pytest
# captures only Python's sys.stdout and sys.stderr, so that the last words of
# a process that dies (a C++ abort's message, a crashed xdist worker's
# output, beside faulthandler's Python stack) reach the log rather than a
# capture file that dies with it.
LOG_ARGS = (
    "--durations=25",
    "--durations-min=1",
    *(("--capture=sys",) if os.environ.get("CI") else ()),
)

# The ONNX and ExecuTorch tests (tests/test_onnx.py, tests/test_executorch.py,
# tests/test_deployment.py) need the deploy group: about a GB and a minute to
# install, and executorch is built for one torch. They run in one tests
# session (their representative part) and in nox -s deploy (all of them);
# the other sessions skip them.
DEPLOY_SESSION = (PYTHONS[0], BUILD_TORCH)
DEPLOY_TESTS_ELSEWHERE = (
    "tests/test_onnx.py, tests/test_executorch.py and tests/test_deployment.py are skipped in "
    f"this session: they run in tests(python='{DEPLOY_SESSION[0]}', "
    f"torch='{DEPLOY_SESSION[1]}') and nox -s deploy, which install the deploy group"
)


def runs_deploy_tests(python: object, torch: str) -> bool:
    """Whether the tests session of (python, torch) runs the deployment tests."""
    return (str(python), torch) == DEPLOY_SESSION
