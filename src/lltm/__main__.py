"""Command line: ``python -m lltm {info,bench}`` (also installed as ``lltm``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lltm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, ABI, registered kernels and CUDA status")
    commands.add_parser(
        "bench",
        help="benchmark lltm against the reference (see: lltm bench --help)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "info":
        from .info import main as info_main

        return info_main(rest)
    from .bench import main as bench_main

    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
