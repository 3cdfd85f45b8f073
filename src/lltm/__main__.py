"""Command line: ``python -m lltm {info,bench}`` (also installed as ``lltm``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def parser() -> argparse.ArgumentParser:
    """The command line of ``lltm``: its subcommands parse their own arguments."""
    p = argparse.ArgumentParser(prog="lltm", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, ABI, registered kernels and CUDA status")
    commands.add_parser(
        "bench",
        help="benchmark lltm against the reference (see: lltm bench --help)",
        add_help=False,
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``lltm info`` or ``lltm bench`` with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status.
    """
    args, rest = parser().parse_known_args(argv)
    if args.command == "info":
        from .info import main as info_main

        return info_main(rest)
    from .bench import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
