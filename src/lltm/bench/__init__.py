"""``python -m lltm bench``: lltm against the LLTM in plain PyTorch and its rivals.

With no arguments: one cell step at the tutorial's size (batch 16, 32
features, state 128, float32) in the tutorial's own configuration, on the best
available device (CUDA when lltm's CUDA kernels are active), in well under a
minute. All LLTM implementations get the same weights and the same inputs.

Cell (the default): one step, called as the tutorial calls it,
new_h, new_cell = rnn(input, (old_h, old_cell)):

  reference       the tutorial's pure-PyTorch LLTM (lltm.reference.LLTM),
                  eager: the baseline
  compiled        the same module under torch.compile
  lltm            lltm.LLTM, the fused operator
  lstmcell        torch.nn.LSTMCell(features, state): four gates where the
                  LLTM has three
  gemm            not a cell: only the matrix products one step needs
                  (forward [old_h, input] @ W^T; backward d_gates^T @
                  [old_h, input], and d_gates @ W with --inputs-grad), the
                  floor under any implementation

Sequence (--seq-len T[,T...]): T steps, output, (h_n, c_n) = rnn(input,
(h_0, c_0)) with input (T, batch, features), as torch.nn.LSTM takes it:

  reference-loop  the reference cell in a Python loop over the steps: the
                  baseline
  lltm-loop       lltm.LLTM in a Python loop over the steps
  lltm-sequence   lltm.LLTMSequence: the whole sequence in one operator call
                  (on a GPU the table names its path: the persistent kernels
                  in clusters or a cooperative grid, or per-step)
  lltm-sequence-per-step
                  the same with LLTM_CUDA_PERSISTENT=0: on a GPU, the
                  per-step path (a product and a pointwise kernel a step)
  lstm            torch.nn.LSTM(features, state) (cuDNN, oneDNN or ATen):
                  four gates where the LLTM has three
  lstm-notf32     the same with torch.backends.cudnn.allow_tf32 = False:
                  cuDNN's float32 products exact, as lltm's (by default
                  they run in TF32)
  gemm            only the matrix products a fused implementation cannot
                  avoid: forward the input projection of all steps at once,
                  (T*B, F) x (F, 3S), and T recurrent (B, S) x (S, 3S);
                  backward T-1 recurrent (B, 3S) x (3S, S) (T with
                  --inputs-grad), the weight gradient (3S, T*B) x (T*B, S+F)
                  and, with --inputs-grad, (T*B, 3S) x (3S, F)

Per-sample gradients (--per-sample): the gradients of the parameters for
each of -b samples (default 32) apart. A sample is one sequence of --seq-len
steps (default 50), (T, features), started from the zero state; its loss is
the mean squared error of its output against a random target:

  lltm-loop       a Python loop over the samples with lltm.LLTMSequence,
                  one forward and torch.autograd.grad per sample (each
                  sample's gradients kept as returned, not stacked): the
                  baseline
  lltm-vmap       torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
                  over torch.func.functional_call of lltm.LLTMSequence:
                  parameters shared, samples and targets batched
  lltm-batched    not per-sample: one forward and backward of the whole batch,
                  the gradient of the mean loss; the floor a per-sample method
                  can approach
  lstm-vmap       the same vmap(grad(loss)) over torch.nn.LSTM(features,
                  state), which vmap can only run one sample at a time
  lstm-loop       the loop of lltm-loop over torch.nn.LSTM

Per-call overhead (--overhead): one cell step at the smallest size, batch 1,
2 features, state 2 (unless -b, -f, -s or --sizes say otherwise), where the
kernels have next to nothing to do and the time is what every call costs
around them (Python, the dispatcher, autograd's nodes and engine). Phases:
no_grad, the forward under torch.no_grad() (inference), and step; against
the reference and nn.LSTMCell:

  reference       the tutorial's pure-PyTorch LLTM: the baseline
  lltm            lltm.LLTM
  lstmcell        torch.nn.LSTMCell(features, state)
  lltm-sequence   lltm.LLTMSequence over a sequence of one step (T = 1)
  lstm            torch.nn.LSTM(features, state) over the same sequence:
                  compare lltm-sequence with it

Configuration: as in the tutorial's benchmark, the inputs come from
torch.randn and only the parameters require grad. With --inputs-grad the
inputs require grad too (input, h and c; input, h_0 and c_0), as in a
recurrent network where the state comes from the previous step, and the
backward phases compute their gradients as well.

Phases: forward (recording the autograd graph), backward (from a retained
graph, the gradients of new_h.sum() + new_cell.sum(), or of output.sum() +
h_n.sum() + c_n.sum() for sequences, with respect to every tensor that
requires grad) and step (both, on a fresh graph each time); per-sample
gradients have only the step.

Loss (--loss, cells and sequences): each size runs twice, a row per loss.
"sum" differentiates that sum as the tutorial's benchmark does,
(new_h.sum() + new_cell.sum()).backward(): each output's gradient reaches
the cell as one value broadcast by stride 0, and the gradients accumulate in
.grad. "dense" hands autograd the same gradients as dense tensors of ones
(torch.autograd.grad), as from a loss that reads every element. Speed-ups
compare rows of the same loss. Each measurement is a block of calls timed by
torch.utils.benchmark (warm-up, GPU synchronisation); the implementations take turns block by block so that
machine noise hits them alike. The table gives min / median over blocks, and
speed-ups of medians against the baseline; for sequences also against
nn.LSTM (its median over ours: above 1 is faster than nn.LSTM), for per-sample
gradients against nn.LSTM under vmap, for the per-call overhead against
nn.LSTMCell (1 / that speed-up is the time as a fraction of nn.LSTMCell's).

Distance to the limit (sequences): the step's rate in GFLOP/s of the matrix
products an LLTM sequence needs (the gemm row's products, 2 operations per
multiply-add; the pointwise work is not counted) at its median time, for
each LLTM implementation, and in parentheses that rate as a fraction of a
large GEMM's (torch.mm of two 1024 x 1024 matrices on the CPU, 4096 on a
GPU, in the run's dtype), which takes its turn in every round of the same
run: the title gives its median rate. nn.LSTM's row has none (its four gates
need other products).

Memory (cells and sequences): bytes of the distinct storages that one
forward's autograd graph keeps for backward
(torch.autograd.graph.saved_tensors_hooks), in all and beyond the inputs and
parameters themselves.

Mixed precision (--autocast bf16 or fp16; cells and sequences): the float32
model and its loss run under torch.autocast(device, bfloat16 or float16), the
backward outside it, as Lightning's precision="bf16-mixed" trains; every
implementation alike (nn.LSTM too), the GEMM floor's products and the large
GEMM in the 16-bit dtype.

Extras (pip install 'lltm[bench]'): rich for the table and progress bar.
"""

from __future__ import annotations

from .cases import Case, make_case
from .cli import main, parser, run
from .kinds import CELL, KINDS, NO_GRAD, OVERHEAD, PER_SAMPLE, PHASES, SEQUENCE, Kind, Size
from .report import to_json
from .timing import Result, measure

__all__ = [
    "CELL",
    "KINDS",
    "NO_GRAD",
    "OVERHEAD",
    "PER_SAMPLE",
    "PHASES",
    "SEQUENCE",
    "Case",
    "Kind",
    "Result",
    "Size",
    "main",
    "make_case",
    "measure",
    "parser",
    "run",
    "to_json",
]
