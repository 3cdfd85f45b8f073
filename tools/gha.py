"""GitHub Actions workflow files as data, for the local checks.

check_workflows.py (``nox -s workflows``) and check_recipe.py (``nox -s
recipe``) read .github/workflows/*.yml with this module to compare what a
runner would do with what the noxfile, the recipe and the cibuildwheel
configurations expect. It knows as much of GitHub's semantics as those
workflows use: matrix expansion (product, exclude, include) and the
``${{ matrix.* }}`` / ``${{ env.* }}`` expressions; anything else in an
expression is an error rather than a guess.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def load(name: str) -> dict:
    with open(WORKFLOWS / name, encoding="utf-8") as f:
        workflow = yaml.safe_load(f)
    # YAML 1.1 reads the key `on` as the boolean True.
    if True in workflow:
        workflow["on"] = workflow.pop(True)
    return workflow


def matrix_rows(job: dict) -> list[dict[str, str]]:
    """The job's matrix combinations as GitHub expands them ([{}] without a matrix)."""
    matrix = dict(job.get("strategy", {}).get("matrix", {}))
    include = matrix.pop("include", [])
    exclude = matrix.pop("exclude", [])
    keys = list(matrix)
    rows = [dict(zip(keys, values, strict=True)) for values in itertools.product(*matrix.values())]
    rows = [r for r in rows if not any(all(r.get(k) == v for k, v in e.items()) for e in exclude)]
    if not keys:
        rows = []
    for extra in include:
        # An include entry extends every combination whose original values it
        # matches; one that matches none is a combination of its own.
        matched = False
        for row in rows:
            if keys and all(row[k] == extra[k] for k in keys if k in extra):
                row.update({k: v for k, v in extra.items() if k not in keys})
                matched = True
        if not matched:
            rows.append(dict(extra))
    return [{k: str(v) for k, v in row.items()} for row in rows] or [{}]


def resolve(value: object, matrix: dict[str, str], env: dict[str, str]) -> str:
    """A string with its ``${{ matrix.* }}`` and ``${{ env.* }}`` expressions filled in."""

    def substitute(match: re.Match) -> str:
        expression = match.group(1)
        context, _, name = expression.partition(".")
        if context == "matrix" and name in matrix:
            return matrix[name]
        if context == "env" and name in env:
            return env[name]
        raise ValueError(f"cannot evaluate ${{{{ {expression} }}}} here")

    return EXPRESSION.sub(substitute, str(value))


def job_env(workflow: dict, job: dict, matrix: dict[str, str]) -> dict[str, str]:
    """The workflow's and the job's env, resolved for one matrix combination."""
    env: dict[str, str] = {}
    for scope in (workflow.get("env", {}), job.get("env", {})):
        for key, value in scope.items():
            env[key] = resolve(value, matrix, env)
    return env


def step_env(step: dict, matrix: dict[str, str], env: dict[str, str]) -> dict[str, str]:
    return {**env, **{k: resolve(v, matrix, env) for k, v in step.get("env", {}).items()}}


def action(step: dict) -> str:
    """``owner/repo`` of a ``uses:`` step, without the ref ('' for a run step)."""
    return step.get("uses", "").split("@")[0]


def runs(workflow: dict) -> Iterator[tuple[str, dict, dict[str, str], dict[str, str]]]:
    """(job id, job, matrix combination, job env) for every job and combination."""
    for job_id, job in workflow["jobs"].items():
        for matrix in matrix_rows(job):
            yield job_id, job, matrix, job_env(workflow, job, matrix)


def path_filter_matches(patterns: list[str], path: str) -> bool:
    """Whether a ``paths:`` filter selects ``path``: the last matching pattern
    decides, ``!`` negates, ``*`` stays within one directory, ``**`` does not."""
    selected = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern[1:] if negated else pattern
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**", i):
                regex += ".*"
                i += 2
            elif glob[i] == "*":
                regex += "[^/]*"
                i += 1
            elif glob[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(glob[i])
                i += 1
        if re.fullmatch(regex, path):
            selected = not negated
    return selected
