"""Checks .github/workflows against what the runners will meet.

Run by ``nox -s workflows`` after actionlint, zizmor and the JSON schemas,
which check each workflow on its own; this compares the workflows with the
rest of the repository:

* every job that runs nox installs the Python of each session it selects
  (the sessions and their Pythons are asked of noxfile.py itself, with the
  job's environment: nox on CI fails a session whose Python is missing);
* the deployment tests run: some job runs ``nox -s deploy`` and the tests
  session that installs the deploy group (the first Python of
  LLTM_NOX_PYTHONS with the torch executorch is built for);
* the pull-request path filters of wheels.yml and conda.yml select every
  file their builds and tests read, so that a change that breaks a platform
  build shows on the pull request rather than after the merge;
* each CUDA wheel of wheels.yml is compiled by a toolkit and against a torch
  of its CUDA major, for setup.py's GPU list, and tested with the CUDA build
  of the newest torch for that major, through variables that
  tools/cibuildwheel-cuda.toml passes into the container and uses; the
  job frees the runner's disk before cibuildwheel fills it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import yaml

from tools import gha, project_facts

if sys.version_info >= (3, 11):
    import tomllib
else:  # the workflows session installs tomli there
    import tomli as tomllib

ROOT = gha.ROOT
CUDA_CONFIG = "tools/cibuildwheel-cuda.toml"
# The PyTorch index of the newest torch's CUDA build per CUDA major, the torch
# that users of that major install: from torch 2.12 on, PyTorch builds CUDA 12
# for CUDA 12.6 only.
NEWEST_TORCH_INDEX = {
    12: "https://download.pytorch.org/whl/cu126",
    13: "https://download.pytorch.org/whl/cu130",
}
# Preinstalled directories of the runner images that the CUDA wheel jobs
# remove to make room for the build container (several GB each).
UNUSED_ON_RUNNER = ["/usr/share/dotnet", "/usr/local/lib/android", "/opt/ghc"]
# What every build compiles or reads: the package sources and the build script.
# README.md also feeds setup.py (the long description), but its text cannot
# break a build; documentation-only changes do not rebuild every platform.
BUILD_INPUTS = ["csrc", "src", "setup.py", "tools/setup_helpers", "pyproject.toml"]
# A nox command at the start of a shell command: `nox ...` or `python -m nox ...`.
NOX_COMMAND = re.compile(r"(?:^|[;&|]\s*)(?:python3?\s+-m\s+)?nox\s+([^;&|\n]*)", re.MULTILINE)


def nox_sessions(nox: list[str], args: list[str], env: dict[str, str]) -> list[dict]:
    """The sessions ``nox <args>`` would run with ``env`` set, from noxfile.py."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLTM_", "NOX"))}
    result = subprocess.run(
        [*nox, "--list", "--json", *args],
        cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"nox {' '.join(args)} --list: {result.stderr}"
    return json.loads(result.stdout)


def check_nox_pythons(nox: list[str]) -> list[tuple[dict, dict[str, str]]]:
    """Returns every session the workflows run, with the environment it runs in."""
    ran: list[tuple[dict, dict[str, str]]] = []
    for name in sorted(p.name for p in gha.WORKFLOWS.glob("*.yml")):
        workflow = gha.load(name)
        for job_id, job, matrix, env in gha.runs(workflow):
            where = f"{name} {job_id} {matrix or ''}".strip()
            installed: set[str] = set()
            for step in job.get("steps", []):
                if gha.action(step) == "actions/setup-python":
                    installed |= set(
                        gha.resolve(step["with"]["python-version"], matrix, env).split()
                    )
                if "run" not in step:
                    continue
                script = gha.resolve(step["run"], matrix, env)
                for match in NOX_COMMAND.finditer(script):
                    args = shlex.split(match.group(1))
                    run_env = gha.step_env(step, matrix, env)
                    sessions = nox_sessions(nox, args, run_env)
                    assert sessions, f"{where}: `nox {match.group(1)}` selects no session"
                    ran += [(session, run_env) for session in sessions]
                    for session in sessions:
                        python = session["python"]  # None: nox's own; False: no environment
                        assert python in (None, False) or python in installed, (
                            f"{where}: nox session {session['session']} runs on Python "
                            f"{python}, but the job installs {sorted(installed) or 'none'} "
                            "before it (actions/setup-python)"
                        )
                    pythons = sorted({s["python"] for s in sessions if s["python"]})
                    print(f"{where}: nox {' '.join(args)}: Python {', '.join(pythons)} installed")
    return ran


def check_deploy_tests(ran: list[tuple[dict, dict[str, str]]]) -> None:
    names = {session["session"] for session, _ in ran}
    assert "deploy" in names, "no workflow runs nox -s deploy (the whole deployment product)"
    pythons = project_facts.nox_default("LLTM_NOX_PYTHONS")
    build_torch = project_facts.nox_default("LLTM_BUILD_TORCH")
    deploy_tests = set()
    for session, env in ran:
        python = env.get("LLTM_NOX_PYTHONS", pythons).split(",")[0].strip()
        torch = env.get("LLTM_BUILD_TORCH", build_torch)
        if session["session"] == f"tests(python='{python}', torch='{torch}')":
            deploy_tests.add(session["session"])
    assert deploy_tests, (
        "no workflow runs the tests session that installs the deploy group (the first Python "
        f"of LLTM_NOX_PYTHONS with torch {build_torch}): the ONNX and ExecuTorch "
        "tests would run nowhere"
    )
    print(f"the deployment tests run in {', '.join(sorted(deploy_tests))} and deploy")


def tracked_files() -> list[str]:
    """The repository's files (git ls-files; the file tree outside a checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return out.split()
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".nox", "build", "dist", "wheelhouse", "__pycache__"}
        return [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]


def expand(entries: list[str], files: list[str]) -> set[str]:
    """Entries (files or directories, relative to the root) as the files they hold."""
    out = set()
    for entry in entries:
        entry = entry.rstrip("/")
        matched = [f for f in files if f == entry or f.startswith(entry + "/")]
        assert matched, f"{entry} names no file of the repository"
        out.update(matched)
    return out


def cibuildwheel_inputs(config: str, files: list[str]) -> list[str]:
    """The files a cibuildwheel configuration makes the build read: itself, its
    test-sources, and the repository's files its commands name ({project}/...;
    others, such as {project}/dist/*.whl, are made during the run)."""
    with open(ROOT / config, "rb") as f:
        options = tomllib.load(f)["tool"]["cibuildwheel"]
    inputs = [config, *options.get("test-sources", [])]
    sections = [options, *(options.get(p, {}) for p in ("linux", "macos", "windows"))]
    for section in sections:
        for value in section.values():
            commands = value if isinstance(value, list) else [value]
            for command in commands:
                if isinstance(command, str):
                    named = re.findall(r"\{(?:project|package)\}/([\w./-]+)", command)
                    inputs += [path for path in named if path in files]
    return inputs


def recipe_inputs() -> list[str]:
    """The recipe, and the source files its tests and metadata use (source: ..)."""
    with open(ROOT / "recipe" / "recipe.yaml", encoding="utf-8") as f:
        recipe = yaml.safe_load(f)
    assert recipe["source"] == {"path": ".."}, recipe["source"]
    inputs = ["recipe", recipe["about"]["license_file"]]
    for test in recipe.get("tests", []):
        inputs += test.get("files", {}).get("source", [])
    return inputs


def check_path_filters() -> None:
    files = tracked_files()
    wheel_configs = ["pyproject.toml", "tools/cibuildwheel-cuda.toml"]
    needs = {
        # cibuildwheel (both configurations) and the sdist job (MANIFEST.in).
        "wheels.yml": [
            *BUILD_INPUTS,
            "MANIFEST.in",
            *(i for c in wheel_configs for i in cibuildwheel_inputs(c, files)),
        ],
        # rattler-build on the source tree.
        "conda.yml": [*BUILD_INPUTS, *recipe_inputs()],
    }
    for name, inputs in needs.items():
        workflow = gha.load(name)
        patterns = workflow["on"]["pull_request"]["paths"]
        wanted = expand([*inputs, f".github/workflows/{name}"], files)
        missed = sorted(f for f in wanted if not gha.path_filter_matches(patterns, f))
        assert not missed, (
            f"{name}: pull requests that change these files do not run it: {missed}; "
            f"add them to on.pull_request.paths"
        )
        print(f"{name}: the pull-request paths cover all {len(wanted)} files its jobs read")


def index_cuda_major(url: str) -> int:
    """12 for https://download.pytorch.org/whl/cu126."""
    match = re.fullmatch(r"https://download\.pytorch\.org/whl/cu(\d+)(\d)", url)
    assert match, f"{url} is not a CUDA index of download.pytorch.org"
    return int(match.group(1))


def check_cuda_wheels() -> None:
    workflow = gha.load("wheels.yml")
    with open(ROOT / CUDA_CONFIG, "rb") as f:
        config = tomllib.load(f)["tool"]["cibuildwheel"]
    passed = set(config["environment-pass"])
    commands = {
        key: " ".join(config[key] if isinstance(config[key], list) else [config[key]])
        for key in ("before-build", "before-test")
    }
    # The index each step installs torch from: the build's, then the test's.
    assert "$LLTM_TORCH_INDEX" in commands["before-build"], commands["before-build"]
    assert "LLTM_TEST_TORCH_INDEX" in commands["before-test"], commands["before-test"]
    arch_lists = project_facts.arch_lists()
    majors = set()
    for job_id, job, matrix, env in gha.runs(workflow):
        steps = [s for s in job["steps"] if gha.action(s) == "pypa/cibuildwheel"]
        if not any(CUDA_CONFIG in s.get("with", {}).get("config-file", "") for s in steps):
            continue
        (step,) = steps
        values = gha.step_env(step, matrix, env)
        where = f"wheels.yml {job_id} (lltm-cuda{matrix['major']})"
        before = job["steps"][: job["steps"].index(step)]
        freeing = " ".join(s.get("run", "") for s in before if "rm -rf" in s.get("run", ""))
        kept = [d for d in UNUSED_ON_RUNNER if d not in freeing]
        assert not kept, f"{where}: no step before cibuildwheel removes {kept}"
        major = int(matrix["major"])
        majors.add(major)
        assert int(values["LLTM_CUDA_VERSION"].split(".")[0]) == major, (where, values)
        assert index_cuda_major(values["LLTM_TORCH_INDEX"]) == major, (where, values)
        assert values["LLTM_TEST_TORCH_INDEX"] == NEWEST_TORCH_INDEX[major], (
            f"{where}: tested with torch from {values['LLTM_TEST_TORCH_INDEX']}, "
            f"not the newest torch for CUDA {major}, {NEWEST_TORCH_INDEX[major]}"
        )
        assert values["TORCH_CUDA_ARCH_LIST"] == arch_lists[major], (where, values)
        # What the step sets for the build must reach the container.
        wanted = {k for k in step.get("env", {}) if not k.startswith("CIBW_")}
        assert wanted <= passed, f"{where}: {sorted(wanted - passed)} not in environment-pass"
        print(
            f"{where}: CUDA {values['LLTM_CUDA_VERSION']}, built against "
            f"{values['LLTM_TORCH_INDEX']}, tested with {values['LLTM_TEST_TORCH_INDEX']}"
        )
    assert majors == set(NEWEST_TORCH_INDEX), f"CUDA wheels for {sorted(majors)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nox-python",
        default=sys.executable,
        help="the Python whose nox reads noxfile.py (default: this one)",
    )
    options = parser.parse_args()
    check_deploy_tests(check_nox_pythons([options.nox_python, "-m", "nox"]))
    check_path_filters()
    check_cuda_wheels()
    return 0


if __name__ == "__main__":
    sys.exit(main())
