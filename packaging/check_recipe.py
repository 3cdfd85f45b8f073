"""Renders recipe/recipe.yaml for every platform and variant and checks the matrix.

Run by ``nox -s recipe`` (py-rattler-build renders recipes without building
them, so this needs no conda channel). Checks, for every rendered variant:
name and version, the build string (processor, python, hash, build number),
the pytorch pins of the same processor type in host and run, the CUDA
compiler only where it is needed, and the arch list of each CUDA version.
.github/workflows/conda.yml selects one processor type per job by adding a
variant file that sets cuda_compiler_version; that is rendered here too.
"""

from __future__ import annotations

import ast
import re
import sys
import tempfile
from pathlib import Path

from rattler_build import JinjaConfig, RenderConfig, Stage0Recipe, VariantConfig
from rattler_build.tool_config import PlatformConfig

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


def project_version() -> str:
    text = (ROOT / "src" / "lltm" / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def setup_arch_lists() -> dict[int, str]:
    """setup.py's DEFAULT_ARCH_LIST (read without importing setup.py)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DEFAULT_ARCH_LIST" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no DEFAULT_ARCH_LIST")


def render(platform: str, extra_variant_files: list[Path] = ()) -> list:
    config = PlatformConfig(
        target_platform=platform, build_platform=platform, host_platform=platform
    )
    variants = VariantConfig.from_files_with_context(
        [VARIANTS, *extra_variant_files], JinjaConfig(platform=config)
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
    version = project_version()
    arch_lists = setup_arch_lists()
    total = 0
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

        # conda.yml: one job per processor type, selected by an extra variant file.
        for cuda in sorted(cudas):
            with tempfile.TemporaryDirectory() as tmp:
                override = Path(tmp) / "variant.yaml"
                override.write_text(f'cuda_compiler_version:\n  - "{cuda}"\n')
                selected = render(platform, [override])
            assert {r.variant["cuda_compiler_version"] for r in selected} == {cuda}, platform
            assert len(selected) == len(PYTHONS), (platform, cuda, len(selected))
    print(f"recipe: {total} variants rendered and checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
