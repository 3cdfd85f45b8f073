"""Checks .github/workflows against what the runners will meet.

Run by ``nox -s workflows`` after actionlint, zizmor and the JSON schemas,
which check each workflow on its own; this compares the workflows with the
rest of the repository:

* every job that runs nox installs the Python of each session it selects
  (the sessions and their Pythons are asked of noxfile.py itself, with the
  job's environment: nox on CI fails a session whose Python is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

import gha

ROOT = gha.ROOT
# A nox command at the start of a shell command: `nox ...` or `python -m nox ...`.
NOX_COMMAND = re.compile(r"(?:^|[;&|]\s*)(?:python3?\s+-m\s+)?nox\s+([^;&|\n]*)", re.MULTILINE)


def nox_sessions(nox: list[str], args: list[str], env: dict[str, str]) -> list[dict]:
    """The sessions ``nox <args>`` would run with ``env`` set, from noxfile.py."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLTM_", "NOX"))}
    out = subprocess.run(
        [*nox, "--list", "--json", *args],
        cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out)


def check_nox_pythons(nox: list[str]) -> None:
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
                    for session in sessions:
                        python = session["python"]
                        assert python is None or python in installed, (
                            f"{where}: nox session {session['session']} runs on Python "
                            f"{python}, but the job installs {sorted(installed) or 'none'} "
                            "before it (actions/setup-python)"
                        )
                    pythons = sorted({s["python"] for s in sessions if s["python"]})
                    print(f"{where}: nox {' '.join(args)}: Python {', '.join(pythons)} installed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nox-python",
        default=sys.executable,
        help="the Python whose nox reads noxfile.py (default: this one)",
    )
    options = parser.parse_args()
    check_nox_pythons([options.nox_python, "-m", "nox"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
