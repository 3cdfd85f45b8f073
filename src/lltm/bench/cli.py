"""The command line: flags, one run over the sizes asked for, its outputs."""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch

from .._version import __version__
from . import cases, flops, kinds, memory, report, timing
from .kinds import CELL, OVERHEAD, PER_SAMPLE, SEQUENCE, Kind, Size

# The name under which the large GEMM is timed (never an implementation's).
LARGE_GEMM = "large-gemm"

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
# --autocast: the 16-bit dtype torch.autocast runs a float32 model in.
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


# --- A run -----------------------------------------------------------------------


def pick_device(name: str) -> torch.device:
    """The device ``--device`` names; ``auto`` is CUDA where lltm's CUDA kernels are active."""
    from .. import _backends

    if name == "auto":
        active, _why = _backends.cuda_status()
        return torch.device("cuda" if active else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("lltm bench: CUDA was asked for, but no CUDA device is available")
    return torch.device(name)


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device, dtype: torch.dtype, threads: int) -> dict[str, Any]:
    """Versions and machine: what a reader needs to compare two runs."""
    env: dict[str, Any] = {
        "lltm": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "threads": threads,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def sizes_of(args: argparse.Namespace) -> list[Size]:
    """Every (batch, features, state) asked for, times every sequence length."""
    if args.sizes:
        shapes = [(s.batch, s.features, s.state) for s in args.sizes]
    elif args.sweep:
        shapes = list(kinds.SWEEP)
    else:
        shapes = [(args.batch_size, args.features, args.state_size)]
    return [
        Size(*shape, seq_len, loss)
        for shape in shapes
        for seq_len in args.seq_len or [None]
        for loss in args.loss
    ]


def run(args: argparse.Namespace) -> tuple[list[timing.Result], dict[str, Any]]:
    """Measures every implementation of ``args.impl`` at every size.

    An implementation that fails is reported as such, not fatal.
    """
    device = pick_device("cuda" if args.cuda else args.device)
    dtype = torch.float64 if args.double else DTYPES[args.dtype]
    autocast = AUTOCAST[args.autocast] if args.autocast else None
    # What the products and the sequence op run in: the autocast dtype, if any.
    compute = autocast or dtype
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    kind = kind_of_args(args)
    sizes = sizes_of(args)
    impls = list(dict.fromkeys([kind.baseline, *args.impl]))  # speed-ups are against it
    blocks_per_impl = len(kind.phases) * args.runs
    results: list[timing.Result] = []
    # The large GEMM the products' GFLOP/s are compared with, taking its turn
    # in every round at every size: its blocks over the whole run.
    gemm_fn, gemm_n, gemm_flops = (
        flops.large_gemm(device, compute) if kind.counts_flops else (None, 0, 0)
    )
    gemm_times: list[float] = []
    with timing.progress(
        len(sizes) * len(impls) * blocks_per_impl, len(sizes) > 1 and not args.quiet
    ) as start:
        for size in sizes:
            length = "" if size.seq_len is None else f" T={size.seq_len}"
            loss = f" {size.loss} loss" if len(args.loss) > 1 else ""
            precision = f"{dtype} (autocast {autocast})" if autocast else str(dtype)
            advance = start(f"{size}{length}{loss} {precision} {device}")
            ready: list[cases.Case] = []
            for impl in impls:
                try:
                    case = cases.make_case(
                        impl,
                        size,
                        device,
                        dtype,
                        inputs_grad=args.inputs_grad,
                        seed=args.seed,
                        kind=kind,
                        autocast=autocast,
                    )
                    for phase in kind.phases:  # fail early: compile errors, unsupported dtypes
                        case.phase(phase)()
                    ready.append(case)
                except Exception as error:  # noqa: BLE001 - one failing implementation must not end the run
                    message = f"{type(error).__name__}: {error}".splitlines()[0]
                    results.append(timing.Result(size, impl, error=message))
                    for _ in range(blocks_per_impl):
                        advance()
            extra = {LARGE_GEMM: gemm_fn} if gemm_fn is not None and ready else None
            host: dict[str, dict[str, list[float]]] | None = {} if args.host_time else None
            times = timing.measure(
                ready, args.runs, threads, args.block_seconds, advance, kind.phases, extra, host
            )
            gemm_times += times.get(LARGE_GEMM, {}).get("step", [])
            for case in ready:
                result = timing.Result(
                    size,
                    case.impl,
                    times=times[case.impl],
                    host=(host or {}).get(case.impl, {}),
                    flops=flops.flops_of(kind, case.impl, size, args.inputs_grad),
                    path=sequence_path(case.impl, size, device, compute),
                )
                if args.memory:
                    result.peak_bytes = peak_memory(case.impl, size, device, dtype, kind, args)
                with contextlib.suppress(Exception):
                    saved = case.saved_for_backward() if kind.saved_memory else None
                    if saved is not None:
                        result.saved_bytes, result.saved_beyond_inputs_bytes = saved
                results.append(result)
    results.sort(key=lambda r: (sizes.index(r.size), impls.index(r.impl)))
    env = environment(device, dtype, threads)
    env["blocks"] = args.runs
    env["command"] = " ".join(["python -m lltm bench", *args.argv])
    env["case"] = kind.name
    env["inputs_grad"] = args.inputs_grad
    env["seq_len"] = args.seq_len
    if autocast is not None:
        env["autocast"] = str(autocast).removeprefix("torch.")
    if len(kind.losses) > 1:
        env["losses"] = args.loss
    if gemm_times:
        env["large_gemm"] = {
            "n": gemm_n,
            "gflops": gemm_flops / statistics.median(gemm_times) / 1e9,
            "blocks": len(gemm_times),
        }
    return results, env


def peak_memory(
    impl: str,
    size: Size,
    device: torch.device,
    dtype: torch.dtype,
    kind: Kind,
    args: argparse.Namespace,
) -> dict[str, int]:
    """--memory: one call's peak of each memory phase (bench/memory.py), each in a new process.

    A phase the implementation does not run (the GEMM floor's inference) is left out.
    """
    peaks: dict[str, int] = {}
    for phase in memory.PHASES:
        if impl == LARGE_GEMM or (impl == "gemm" and phase == kinds.NO_GRAD):
            continue
        peaks[phase] = memory.peak_bytes(
            impl,
            size,
            device,
            dtype,
            inputs_grad=args.inputs_grad,
            kind=kind,
            autocast=AUTOCAST[args.autocast] if args.autocast else None,
            phase=phase,
        )
    return peaks


def sequence_path(
    impl: str, size: Size, device: torch.device, dtype: torch.dtype
) -> dict[str, str] | None:
    """How lltm's sequence op ran for ``impl`` on a GPU, or None (not such a case).

    The persistent kernels or the per-step path, as the CUDA plugin's rule
    answers for that device (lltm._backends.sequence_path), or as it measured
    them with ``torch.backends.cudnn.benchmark`` set (``measured: ...``, and
    each pass's candidates with their times).
    """
    from .. import _backends

    if device.type != "cuda" or not impl.startswith("lltm-sequence"):
        return None
    if impl == "lltm-sequence-per-step":
        forced = "per-step (LLTM_CUDA_PERSISTENT=0)"
        return {"forward": forced, "backward": forced}
    index = device.index if device.index is not None else torch.cuda.current_device()
    path = _backends.sequence_path(index, dtype, size.batch, size.state)
    if path is None:
        return None
    # With torch.backends.cudnn.benchmark set, the plan the plugin measured
    # for this size is the one taken (the first of a pass: the most recent).
    name = str(dtype).removeprefix("torch.")
    for plan in reversed(_backends.measured_plans()):
        if (plan.dtype, plan.batch, plan.state) == (name, size.batch, size.state):
            key = "backward" if plan.pass_ == "backward" else "forward"
            path[key] = f"measured: {plan.chosen}"
            path[f"{plan.pass_} candidates"] = plan.render()
    return path


# --- Command line ----------------------------------------------------------------


def kind_of_args(args: argparse.Namespace) -> Kind:
    """What the arguments time: per-sample gradients, sequences or cell steps."""
    if args.per_sample:
        return PER_SAMPLE
    if args.overhead:
        return OVERHEAD
    return SEQUENCE if args.seq_len else CELL


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected NAME[,NAME...], got {text!r}")
    return names


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(
            f"expected T[,T...], sequence lengths of at least 1, got {text!r}"
        )
    return lengths


def _size_list(text: str) -> list[Size]:
    try:
        shapes = [
            [int(n) for n in item.lower().split("x")] for item in text.split(",") if item.strip()
        ]
        sizes = [Size(b, f, s) for b, f, s in (shape for shape in shapes if len(shape) == 3)]
        if len(sizes) != len(shapes):
            sizes = []
    except (TypeError, ValueError):
        sizes = []
    if (
        not sizes
        or any(s.seq_len is not None for s in sizes)
        or any(min(s.batch, s.features, s.state) < 0 for s in sizes)
    ):
        raise argparse.ArgumentTypeError(
            f"expected BxFxS[,BxFxS...] (batch x features x state), got {text!r}"
        )
    return sizes


def _choices(kind: Kind) -> str:
    return f"{','.join(kind.implementations)}, or all (default {','.join(kind.defaults)})"


def parser() -> argparse.ArgumentParser:
    """The command line of ``lltm bench``."""
    from . import __doc__ as description

    p = argparse.ArgumentParser(
        prog="lltm bench",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = p.add_argument_group("size (the tutorial's flags)")
    size.add_argument(
        "-b",
        "--batch-size",
        type=int,
        help=f"default 16; with --per-sample the number of samples, default {kinds.PER_SAMPLE_BATCH}; "
        f"with --overhead {kinds.OVERHEAD_SIZE[0]}",
    )
    size.add_argument(
        "-f", "--features", type=int, help=f"default 32; with --overhead {kinds.OVERHEAD_SIZE[1]}"
    )
    size.add_argument(
        "-s",
        "--state-size",
        type=int,
        help=f"default 128; with --overhead {kinds.OVERHEAD_SIZE[2]}",
    )
    size.add_argument(
        "--sweep",
        action="store_true",
        help="instead, the sizes " + ", ".join(str(Size(*s)) for s in kinds.SWEEP),
    )
    size.add_argument(
        "--sizes",
        type=_size_list,
        metavar="BxFxS,...",
        help="instead, these sizes, e.g. 16x32x128,256x1024x1024",
    )
    what = p.add_argument_group("what and where")
    what.add_argument(
        "--seq-len",
        type=_lengths,
        metavar="T,...",
        help="time whole sequences of these lengths instead of one cell step "
        "(with every size asked for)",
    )
    what.add_argument(
        "--per-sample",
        action="store_true",
        help="time per-sample gradients of the parameters instead: one sequence per sample, "
        f"of length {kinds.PER_SAMPLE_SEQ_LEN} unless --seq-len says otherwise",
    )
    what.add_argument(
        "--overhead",
        action="store_true",
        help="time what each call costs instead: one cell step at the smallest size ("
        + "x".join(map(str, kinds.OVERHEAD_SIZE))
        + " unless -b, -f, -s or --sizes say otherwise), and a sequence of one step "
        "(lltm-sequence, nn.LSTM), the forward under torch.no_grad() "
        "and forward + backward, against nn.LSTMCell and the reference",
    )
    what.add_argument(
        "--inputs-grad",
        action="store_true",
        help="the inputs and state require grad too (default: only the parameters, "
        "as in the tutorial)",
    )
    what.add_argument(
        "--loss",
        type=_names,
        metavar="NAMES",
        help="how the backward phases differentiate the sum of the outputs, a row each: "
        "sum (the tutorial's new_h.sum() + new_cell.sum(): gradients broadcast by stride 0), "
        "dense (dense gradients, as from a loss that reads each element); cells and "
        "sequences default to sum,dense, the other kinds take dense only",
    )
    what.add_argument(
        "--impl",
        type=_names,
        metavar="NAMES",
        help=f"comma-separated implementations; cell: {_choices(CELL)}; "
        f"sequence: {_choices(SEQUENCE)}; per-sample: {_choices(PER_SAMPLE)}; "
        f"overhead: {_choices(OVERHEAD)}. "
        "The baseline (reference, reference-loop, lltm-loop) always runs",
    )
    what.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): CUDA if lltm's CUDA kernels are active, else CPU",
    )
    what.add_argument("-c", "--cuda", action="store_true", help="same as --device cuda")
    what.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    what.add_argument("-d", "--double", action="store_true", help="same as --dtype float64")
    what.add_argument(
        "--autocast",
        choices=sorted(AUTOCAST),
        help="mixed precision: float32 weights and inputs, the model and its loss under "
        "torch.autocast(device, bfloat16 or float16), the backward outside it, as "
        "Lightning's precision='bf16-mixed' trains (cells and sequences)",
    )
    what.add_argument(
        "--threads", type=int, default=0, help="CPU threads (default: torch's current number)"
    )
    how = p.add_argument_group("measurement and output")
    how.add_argument(
        "-r",
        "--runs",
        type=int,
        default=15,
        help="interleaved blocks per implementation and phase (default 15)",
    )
    how.add_argument(
        "--block-seconds",
        type=float,
        default=timing.BLOCK_SECONDS,
        help=f"target length of one block (default {timing.BLOCK_SECONDS})",
    )
    how.add_argument(
        "--host-time",
        action="store_true",
        help="also time each phase's host side: a block of calls that waits on nothing "
        "after each timed block (on a GPU, the Python layer, dispatch and launches: a step "
        "whose host time is near its time waits on the host)",
    )
    how.add_argument(
        "--memory",
        action="store_true",
        help="also measure each implementation's peak memory of one call, inference (the "
        "forward under torch.no_grad()) and a training step, each in a process of its own: "
        "on a CPU the growth of the peak resident set, on a GPU the allocator's peak "
        "(cells and sequences)",
    )
    how.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="run with torch.backends.cudnn.benchmark = True: cuDNN times its algorithms "
        "(nn.LSTM), and lltm's sequence op its plans on the GPU, keeping the fastest (the "
        "path column then says measured)",
    )
    how.add_argument("--seed", type=int, default=0)
    how.add_argument(
        "--scale",
        choices=("auto", *report.UNITS),
        default="auto",
        help="time unit of the table (default auto: us, or ms from 10 ms on)",
    )
    how.add_argument(
        "--json", metavar="FILE", help="write results and environment as JSON (- for stdout)"
    )
    how.add_argument("-q", "--quiet", action="store_true", help="no table, no progress bar")
    return p


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The flags, checked; ``--impl`` resolved against the kind of case."""
    p = parser()
    args = p.parse_args(argv)
    args.argv = list(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.overhead and args.per_sample:
        p.error("--overhead and --per-sample: one kind of case per run")
    if args.overhead and args.seq_len:
        p.error("--overhead times one cell step: no --seq-len")
    kind = kind_of_args(args)
    if args.autocast and kind.name not in kinds.AUTOCAST_KINDS:
        p.error(f"--autocast: only cells and sequences run under autocast, not {kind.name}")
    if args.autocast and (args.double or args.dtype != "float32"):
        p.error("--autocast runs a float32 model in 16 bits: --dtype float32 only")
    if args.memory and kind.name not in kinds.AUTOCAST_KINDS:
        p.error(f"--memory: measured for cells and sequences, not {kind.name}")
    if kind is PER_SAMPLE:
        if args.inputs_grad:
            p.error("--inputs-grad: per-sample gradients are those of the parameters only")
        args.seq_len = args.seq_len or [kinds.PER_SAMPLE_SEQ_LEN]
    if kind is OVERHEAD:
        batch, features, state = kinds.OVERHEAD_SIZE
    else:
        batch = kinds.PER_SAMPLE_BATCH if kind is PER_SAMPLE else 16
        features, state = 32, 128
    args.batch_size = batch if args.batch_size is None else args.batch_size
    args.features = features if args.features is None else args.features
    args.state_size = state if args.state_size is None else args.state_size
    names = args.impl or list(kind.defaults)
    if names == ["all"]:
        names = list(kind.implementations)
    unknown = [n for n in names if n not in kind.implementations]
    if unknown:
        p.error(
            f"argument --impl: no {kind.name} implementation {', '.join(unknown)}; "
            f"choose among {_choices(kind)}"
        )
    args.impl = names
    losses = args.loss or list(kind.losses)
    if any(loss not in kinds.LOSSES for loss in losses) or not set(losses) <= set(kind.losses):
        p.error(
            f"argument --loss: a {kind.name} case takes {', '.join(kind.losses)}; "
            f"got {','.join(losses)}"
        )
    args.loss = list(dict.fromkeys(losses))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``lltm bench`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = parse(list(sys.argv[1:] if argv is None else argv))
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or args.cudnn_benchmark
    try:
        results, env = run(args)
    finally:
        torch.backends.cudnn.benchmark = before
    if args.json:
        report.write_json(results, env, args.json)
    if not args.quiet and args.json != "-":
        report.print_table(results, env, args.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
