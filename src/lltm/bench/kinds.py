"""The kinds of case the bench times, and their sizes.

What a cell step, a sequence, per-sample gradients and the per-call overhead
are compared with, and the sizes each runs at unless told (see
:mod:`lltm.bench.cases` for how a case is built and timed).
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("forward", "backward", "step")
# The forward under torch.no_grad(): inference, no graph recorded. Timed by
# the overhead case only.
NO_GRAD = "no_grad"

# --sweep: (batch, features, state) from below the tutorial's size to a large layer.
SWEEP = (
    (4, 32, 64),
    (16, 32, 128),
    (32, 64, 256),
    (64, 128, 512),
    (128, 256, 1024),
    (256, 1024, 1024),
)


# The loss the backward phases differentiate, the sum of every output's
# elements either way: "sum" computes it as the tutorial's benchmark does,
# new_h.sum() + new_cell.sum(), so that each output's gradient reaches the
# cell as one value broadcast by stride 0; "dense" hands autograd the same
# gradients as dense tensors of ones, as a loss that reads each element
# (a mean squared error, say) gives.
LOSSES = ("sum", "dense")


@dataclass(frozen=True)
class Size:
    """batch x features x state, a sequence's length (None: one cell step), and the loss."""

    batch: int
    features: int
    state: int
    seq_len: int | None = None
    loss: str = "dense"

    def __str__(self) -> str:
        return f"{self.batch}x{self.features}x{self.state}"


@dataclass(frozen=True)
class Kind:
    """A kind of case: its implementations and what they are compared with."""

    name: str
    implementations: tuple[str, ...]
    defaults: tuple[str, ...]
    baseline: str
    """Speed-ups are against this implementation; it always runs."""
    rival: str | None = None
    """A second comparison column (the stock torch module), if any."""
    phases: tuple[str, ...] = PHASES
    """The phases timed, a subset of PHASES in its order."""
    saved_memory: bool = True
    """Whether the bytes one forward saves for backward are measured."""
    sequences: bool = True
    """Whether a case runs whole sequences (its sizes have a seq_len)."""
    counts_flops: bool = False
    """Whether its LLTM implementations' rows report GFLOP/s of the products
    they need (flops.product_flops), against a large GEMM timed in the same run."""
    losses: tuple[str, ...] = ("dense",)
    """The losses (LOSSES) its backward phases differentiate by default, a row each."""


CELL = Kind(
    "cell",
    implementations=("reference", "compiled", "lltm", "lstmcell", "gemm"),
    defaults=("reference", "compiled", "lltm", "lstmcell"),
    baseline="reference",
    sequences=False,
    losses=LOSSES,
)
SEQUENCE = Kind(
    "sequence",
    # lltm-sequence-per-step: the op with LLTM_CUDA_PERSISTENT=0 (on a GPU, its
    # per-step path); lstm-notf32: nn.LSTM with cuDNN's TF32 off, exact float32
    # products as lltm's.
    implementations=(
        "reference-loop",
        "lltm-loop",
        "lltm-sequence",
        "lltm-sequence-per-step",
        "lstm",
        "lstm-notf32",
        "gemm",
    ),
    defaults=("reference-loop", "lltm-loop", "lltm-sequence", "lstm"),
    baseline="reference-loop",
    rival="lstm",
    counts_flops=True,
    losses=LOSSES,
)
PER_SAMPLE = Kind(
    "per-sample",
    implementations=("lltm-loop", "lltm-vmap", "lltm-batched", "lstm-vmap", "lstm-loop"),
    defaults=("lltm-loop", "lltm-vmap", "lltm-batched", "lstm-vmap"),
    baseline="lltm-loop",
    rival="lstm-vmap",
    # Per-sample gradients are one computation: the forward is not kept.
    phases=("step",),
    saved_memory=False,
)
# The overhead case's implementations that run a sequence of one step
# (OVERHEAD_SEQ_LEN) at the case's size: the sequence op's cost per call
# beside nn.LSTM's.
OVERHEAD_SEQUENCES = ("lltm-sequence", "lstm")
OVERHEAD_SEQ_LEN = 1
OVERHEAD = Kind(
    "overhead",
    implementations=("reference", "lltm", "lstmcell", *OVERHEAD_SEQUENCES),
    defaults=("reference", "lltm", "lstmcell", *OVERHEAD_SEQUENCES),
    baseline="reference",
    rival="lstmcell",
    phases=(NO_GRAD, "step"),
    saved_memory=False,
    sequences=False,
)
KINDS = {kind.name: kind for kind in (CELL, SEQUENCE, PER_SAMPLE, OVERHEAD)}

# The kinds that run under --autocast: a model and its loss, trained in mixed
# precision.
AUTOCAST_KINDS = (CELL.name, SEQUENCE.name)

# --overhead without -b, -f or -s: the smallest cell.
OVERHEAD_SIZE = (1, 2, 2)

# --per-sample without -b or --seq-len: 32 samples of 50 steps.
PER_SAMPLE_BATCH = 32
PER_SAMPLE_SEQ_LEN = 50


# The large GEMM whose rate a run's GFLOP/s are compared with: square, of
# this size, in the run's dtype on its device (torch.mm). Large enough that
# the library runs it near the core's (or the GPU's) peak.
LARGE_GEMM = {"cpu": 1024, "cuda": 4096}


def kind_of(size: Size) -> Kind:
    """The kind a size implies when none is named: a cell step or a sequence."""
    return CELL if size.seq_len is None else SEQUENCE
