"""Renders recipe/recipe.yaml for every platform and variant and checks the matrix.

Run by ``nox -s recipe`` (py-rattler-build renders recipes without building
them, so this needs no conda channel). Checks, for every rendered variant:
name and version, the build string (processor, python, hash, build number),
the pytorch pins of the same processor type in host and run, the CUDA
compiler only where it is needed, the arch list of each CUDA version and the
glibc of the sysroot.

.github/workflows/conda.yml runs one job per platform and processor type;
each job's "Select the variant" step writes a variant file that narrows the
matrix to its share. Every job of conda.yml is replayed here: that step's
script runs with the job's matrix values, and the recipe is rendered with the
variant files of the job's build-args, which must give exactly the job's
share of the full matrix. The environment the step leaves for rattler-build
must make a GPU-less runner offer the __cuda virtual package to the CUDA jobs
(a CUDA build of pytorch depends on it) and leave the CPU jobs alone.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from rattler import VirtualPackage, VirtualPackageOverrides
from rattler_build import (
    JinjaConfig,
    RenderConfig,
    Stage0Recipe,
    VariantConfig,
    rattler_build_version,
)
from rattler_build.tool_config import PlatformConfig

from tools import gha, project_facts

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "recipe.yaml"
VARIANTS = ROOT / "recipe" / "variants.yaml"

PYTHONS = {"3.10", "3.11", "3.12", "3.13"}
# Processor types per conda platform: CUDA kernels for Linux x86_64 only.
PROCESSORS = {
    "linux-64": {"None", "12.9", "13.0"},
    "linux-aarch64": {"None"},
    "osx-arm64": {"None"},
    "win-64": {"None"},
}
BUILD_STRING = re.compile(
    r"^(?P<proc>cpu|cuda\d{3})_py(?P<py>3\d+)_h(?P<hash>[0-9a-f]{7})_(?P<num>\d+)$"
)
# glibc of the Linux sysroot per CUDA major (None: the CPU flavour). conda-forge
# builds CUDA 13 against the glibc 2.28 sysroot (the c_stdlib_version of its
# CUDA 13.0 migration), so its CUDA 13 packages need glibc 2.28 anyway.
LINUX_STDLIB = {None: "2.17", 12: "2.17", 13: "2.28"}


def render(platform: str, variant_files: list[Path] = (VARIANTS,)) -> list:
    config = PlatformConfig(
        target_platform=platform, build_platform=platform, host_platform=platform
    )
    variants = VariantConfig.from_files_with_context(
        list(variant_files), JinjaConfig(platform=config)
    )
    return Stage0Recipe.from_file(RECIPE).render(variants, RenderConfig(platform=config))


def check_variant(
    platform: str, rendered, version: str, arch_lists: dict[int, str]
) -> tuple[str, str]:
    variant = rendered.variant
    recipe = rendered.recipe.to_dict()
    cuda = variant["cuda_compiler_version"]
    python = variant["python"]
    where = f"{platform} cuda={cuda} python={python}"

    assert recipe["package"] == {"name": "lltm", "version": version}, (where, recipe["package"])
    string = recipe["build"]["string"]
    match = BUILD_STRING.match(string)
    assert match, f"{where}: build string {string!r}"
    processor = "cpu" if cuda == "None" else "cuda" + cuda.replace(".", "")
    assert match["proc"] == processor, (where, string)
    assert match["py"] == python.replace(".", ""), (where, string)
    number = 0 if cuda == "None" else 100
    assert recipe["build"]["number"] == number == int(match["num"]), (where, recipe["build"])

    requirements = recipe["requirements"]
    build, host, run = requirements["build"], requirements["host"], requirements["run"]
    pytorch_build = "cpu*" if cuda == "None" else f"cuda{cuda.split('.')[0]}*"
    assert f"pytorch * {pytorch_build}" in host, (where, host)
    assert "pytorch" in host, (where, host)  # pinned to the oldest pytorch by variants.yaml
    assert f"pytorch >=2.10 {pytorch_build}" in run, (where, run)
    assert "python" in run, (where, run)
    assert set(requirements["ignore_run_exports"]["by_name"]) >= {"pytorch", "libtorch"}

    # Tests: import lltm, then run the op and compare it with the reference.
    tests = recipe["tests"]
    imports = [t["python"] for t in tests if "python" in t]
    assert any(t["imports"] == ["lltm"] and t.get("pip_check", True) for t in imports), (
        where,
        tests,
    )
    assert any("python test_lltm.py" in t.get("script", []) for t in tests), (where, tests)
    # The `lltm` command: pip installs it from setup.py's console_scripts; a
    # recipe entry point would write the same script a second time.
    assert not recipe["build"].get("python", {}).get("entry_points"), (where, recipe["build"])
    assert any("lltm info" in t.get("script", []) for t in tests), (where, tests)
    # Compiled kernels for every operator (tools/check_ops.py and its list
    # OPS): CPU in every flavour, CUDA too in the CUDA flavours.
    ops_check = "python tools/check_ops.py " + ("cpu" if cuda == "None" else "cpu cuda")
    (ops_test,) = [t for t in tests if ops_check in t.get("script", [])] or [None]
    assert ops_test, f"{where}: no test runs `{ops_check}`: {tests}"
    assert "tools/check_ops.py" in ops_test["files"]["source"], (where, ops_test)

    # The sysroot's glibc is what the package claims to need (its run_exports).
    major = None if cuda == "None" else int(cuda.split(".")[0])
    if platform.startswith("linux-"):
        stdlib = LINUX_STDLIB[major]
        assert variant["c_stdlib_version"] == stdlib, (where, variant["c_stdlib_version"])
        assert f"sysroot_{platform} {stdlib}.*" in build, (where, build)

    nvcc = [spec for spec in build if spec.startswith("cuda-nvcc")]
    env = recipe["build"]["script"]["env"]
    if cuda == "None":
        assert not nvcc, (where, build)
        assert not any(spec.startswith("cuda-") for spec in host), (where, host)
        assert env["LLTM_CUDA"] == "0" and "TORCH_CUDA_ARCH_LIST" not in env, (where, env)
    else:
        assert nvcc == [f"cuda-nvcc_{platform} {cuda}.*"], (where, build)
        assert f"cuda-version =={cuda}" in host, (where, host)
        assert {"cuda-cudart-dev", "cuda-cccl"} <= set(host), (where, host)
        assert env["LLTM_CUDA"] == "1", (where, env)
        expected_archs = arch_lists[int(cuda.split(".")[0])]
        assert env["TORCH_CUDA_ARCH_LIST"] == expected_archs, (where, env, expected_archs)
    return processor, python


def main() -> int:
    version = project_facts.version()
    arch_lists = project_facts.arch_lists()
    total = 0
    # Build strings per platform and CUDA version (None for the CPU flavour).
    full: dict[str, dict[str, set[str]]] = {}
    for platform, cudas in PROCESSORS.items():
        rendered = render(platform)
        seen = [check_variant(platform, r, version, arch_lists) for r in rendered]
        expected = {
            ("cpu" if c == "None" else "cuda" + c.replace(".", ""), p)
            for c in cudas
            for p in PYTHONS
        }
        assert sorted(seen) == sorted(expected), (platform, sorted(seen), sorted(expected))
        strings = sorted(r.recipe.build.string for r in rendered)
        assert len(set(strings)) == len(strings), f"{platform}: duplicate build strings"
        print(f"{platform}: {len(rendered)} variants: {', '.join(strings)}")
        total += len(rendered)
        full[platform] = {r.variant["cuda_compiler_version"]: set() for r in rendered}
        for r in rendered:
            full[platform][r.variant["cuda_compiler_version"]].add(r.recipe.build.string)
    print(f"recipe: {total} variants rendered and checked")
    check_conda_workflow(full)
    return 0


def replay_job_setup(job: dict, matrix: dict[str, str], env: dict[str, str], cwd: Path) -> dict:
    """Runs the job's "Select the variant" step in ``cwd``, as the runner would;
    returns what it added to GITHUB_ENV."""
    (step,) = [s for s in job["steps"] if s.get("name") == "Select the variant"]
    github_env = cwd / "github_env"
    github_env.touch()
    script_env = {
        **os.environ,
        **gha.step_env(step, matrix, env),
        "GITHUB_ENV": str(github_env),
    }
    script = gha.resolve(step["run"], matrix, env)
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd, env=script_env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    lines = github_env.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line)


def virtual_cuda(env: dict[str, str]) -> str | None:
    """The version of __cuda that rattler offers the solver with ``env`` set
    (rattler-build detects virtual packages with the same overrides from the
    environment, CONDA_OVERRIDE_CUDA among them); None when there is none."""
    saved = dict(os.environ)
    os.environ.pop("CONDA_OVERRIDE_CUDA", None)
    os.environ.update(env)
    try:
        detected = VirtualPackage.detect(VirtualPackageOverrides.from_env())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for package in detected:
        name, version, _ = str(package.into_generic()).split("=")
        if name == "__cuda":
            return version
    return None


def check_conda_workflow(full: dict[str, dict[str, set[str]]]) -> None:
    """Each job of conda.yml builds exactly its share of the full matrix."""
    workflow = gha.load("conda.yml")
    jobs = list(gha.runs(workflow))
    assert jobs, "conda.yml has no jobs"
    # The CLI the jobs run is the one rendered with here: py-rattler-build
    # embeds rattler-build (rattler_build_version() is that crate's version).
    for job_id, job, matrix, env in jobs:
        (build,) = [s for s in job["steps"] if gha.action(s) == "prefix-dev/rattler-build-action"]
        pinned = gha.resolve(build["with"].get("rattler-build-version", "latest"), matrix, env)
        assert pinned == f"v{rattler_build_version()}", (
            f"conda.yml {job_id} runs rattler-build {pinned}; "
            f"this check renders with {rattler_build_version()}"
        )
    print(f"conda.yml: rattler-build v{rattler_build_version()}, as rendered here")
    seen = set()
    for job_id, job, matrix, env in jobs:
        platform, cuda = matrix["target"], matrix["cuda"]
        where = f"conda.yml {job_id} {platform} cuda={cuda}"
        (build,) = [s for s in job["steps"] if gha.action(s) == "prefix-dev/rattler-build-action"]
        args = shlex.split(gha.resolve(build["with"]["build-args"], matrix, env))
        assert "--ignore-recipe-variants" in args, (where, args)
        variant_files = [args[i + 1] for i, a in enumerate(args) if a == "--variant-config"]
        assert variant_files[0] == "recipe/variants.yaml", (where, variant_files)
        with tempfile.TemporaryDirectory() as tmp:
            github_env = replay_job_setup(job, matrix, env, Path(tmp))
            # The step writes its files into the checkout, next to recipe/.
            paths = [ROOT / f if f.startswith("recipe/") else Path(tmp) / f for f in variant_files]
            selected = render(platform, paths)
        strings = {r.recipe.build.string for r in selected}
        assert strings == full[platform][cuda], (where, sorted(strings), full[platform][cuda])
        # __cuda: the CUDA jobs must declare it (no GPU on the runners), at the
        # job's CUDA version (cuda-version X.Y constrains __cuda >= X).
        override = github_env.get("CONDA_OVERRIDE_CUDA")
        if cuda == "None":
            assert override is None, f"{where}: CONDA_OVERRIDE_CUDA={override} on a CPU job"
            vcuda = "no __cuda declared"
        else:
            assert override == cuda, f"{where}: CONDA_OVERRIDE_CUDA is {override!r}, not {cuda}"
            detected = virtual_cuda({**env, **github_env})
            assert detected == cuda, f"{where}: __cuda is {detected!r} with the job's environment"
            vcuda = f"__cuda={detected}"
        seen.add((platform, cuda))
        print(f"{where}: builds {len(strings)} variants, its share of the matrix; {vcuda}")
    expected = {(p, c) for p, cudas in PROCESSORS.items() for c in cudas}
    assert seen == expected, f"conda.yml jobs {sorted(seen)} != {sorted(expected)}"


if __name__ == "__main__":
    sys.exit(main())
