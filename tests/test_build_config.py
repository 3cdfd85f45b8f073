"""setup.py's choices for the CUDA variant, without building anything."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest
import setuptools

SETUP = Path(__file__).resolve().parents[1] / "setup.py"


@pytest.fixture(scope="module")
def setup_py():
    """setup.py's globals, run as the CPU variant with setup() itself stubbed."""
    real_setup, previous = setuptools.setup, os.environ.get("LLTM_VARIANT")
    setuptools.setup = lambda **kwargs: None
    os.environ["LLTM_VARIANT"] = "cpu"
    try:
        yield runpy.run_path(str(SETUP), run_name="__main__")
    finally:
        setuptools.setup = real_setup
        if previous is None:
            os.environ.pop("LLTM_VARIANT", None)
        else:
            os.environ["LLTM_VARIANT"] = previous


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        # Blackwell (10.0, 12.0) needs nvcc 12.8: older CUDA 12 toolkits stop
        # with "Unsupported gpu architecture 'compute_100'".
        ((12, 0), "7.0;7.5;8.0;8.6;8.9;9.0+PTX"),
        ((12, 4), "7.0;7.5;8.0;8.6;8.9;9.0+PTX"),
        ((12, 6), "7.0;7.5;8.0;8.6;8.9;9.0+PTX"),
        ((12, 8), "7.0;7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"),
        ((12, 9), "7.0;7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"),
        ((13, 0), "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"),
        ((13, 2), "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"),
    ],
    ids=lambda v: ".".join(map(str, v)) if isinstance(v, tuple) else None,
)
def test_default_arch_list_follows_the_nvcc_version(setup_py, version, expected):
    assert setup_py["default_arch_list"](*version) == expected


def test_newest_toolkit_of_each_major_gets_the_whole_list(setup_py):
    # The lists the workflows and the recipe pass explicitly (checked there
    # against DEFAULT_ARCH_LIST) are those of the newest toolkits.
    for major, archs in setup_py["DEFAULT_ARCH_LIST"].items():
        assert setup_py["default_arch_list"](major, 9) == archs


@pytest.mark.parametrize(
    ("cflags", "expected"),
    [
        (None, ["-O3", "-std=c++17", "-fdiagnostics-color=always"]),
        # A packager's level does not lower lltm's (a conda build's CFLAGS).
        ("-O2 -fPIC", ["-O3", "-std=c++17", "-fdiagnostics-color=always"]),
        # A sanitized build's does (nox -s sanitize), else -O3 would override it.
        ("-fsanitize=address -O1", ["-std=c++17", "-fdiagnostics-color=always"]),
        ("-fsanitize=address", ["-O3", "-std=c++17", "-fdiagnostics-color=always"]),
    ],
)
def test_only_a_sanitized_build_sets_its_own_optimisation(setup_py, monkeypatch, cflags, expected):
    if cflags is None:
        monkeypatch.delenv("CFLAGS", raising=False)
    else:
        monkeypatch.setenv("CFLAGS", cflags)
    assert setup_py["cxx_flags"]("unix") == expected
    assert setup_py["cxx_flags"]("msvc") == ["/O2", "/std:c++17"]
