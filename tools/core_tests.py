"""The core of the test suite: where the whole suite cannot run, these do.

It reaches every kernel (the cell's forward and backward, the sequence's
forward, inference forward, backward and gate gradients), every dtype (float64 against the
reference to 1e-12; float32, float16 and bfloat16 against the reference's
own accuracy), strided, broadcast and misaligned arguments, the work split
between threads, gradcheck, opcheck, the fuzz (its quick profile), and the
choice of instruction set; few of its tests start interpreters. Left out:
torch.compile, export, the modules' and torch.func's Python layers.

Run under an emulated arm64 CPU (tools/machines/emulated_aarch64.py, where a
test runs 10 to 30 times slower than natively) and, with the error tests,
under each torch release between the test matrix's ends (``nox -s
between``).
"""

CORE = [
    "tests/test_smoke.py::test_import_and_version",
    "tests/test_smoke.py::test_cpu_step_matches_reference",
    "tests/test_smoke.py::test_cpu_sequence_matches_a_loop_of_the_reference",
    "tests/test_cpu_isa.py::test_this_process_runs_the_set_the_environment_asks_for",
    # The other processor's names are refused (a fresh interpreter; 2-3
    # minutes under emulation): see core().
    "tests/test_fused_steps.py::test_tile_and_vector_edges",
    "tests/test_fused_steps.py::test_packed_sequences",
    "tests/test_fused_steps.py::test_blocks_of_rows_per_thread_match_one_thread",
    "tests/test_parity.py::test_float64_matches_reference",
    "tests/test_parity.py::test_low_precision_as_accurate_as_reference",
    "tests/test_parity.py::test_composite_equals_native",
    "tests/test_parity.py::test_16_bit_grad_bias_sums_unrounded_gradients",
    "tests/test_sequence.py::test_float64_matches_loop_of_reference_cell",
    "tests/test_sequence.py::test_native_equals_composite",
    "tests/test_sequence.py::test_lower_precision_as_accurate_as_a_loop_in_that_precision",
    "tests/test_sequence.py::test_gate_grads_are_what_the_backward_multiplies",
    "tests/test_sequence.py::test_packed_sequences_match_per_sequence_loops",
    "tests/test_sequence.py::test_gradcheck_and_gradgradcheck",
    "tests/test_sequence.py::test_opcheck_sequence_forward",
    "tests/test_sequence.py::test_opcheck_sequence_backward",
    "tests/test_sequence.py::test_opcheck_sequence_gate_grads",
    "tests/test_sequence.py::test_two_threads_match_one",
    "tests/test_inference.py::test_inference_equals_training_bit_for_bit",
    "tests/test_inference.py::test_opcheck",
    "tests/test_autograd.py::test_gradcheck_op",
    "tests/test_autograd.py::test_gradgradcheck",
    "tests/test_autograd.py::test_opcheck_forward",
    "tests/test_autograd.py::test_opcheck_backward",
    "tests/test_layouts.py::test_every_argument_unusual",
    "tests/test_layouts.py::test_misaligned_arguments_give_the_results_of_aligned_ones",
    "tests/test_threads.py::test_split_work_matches_reference",
    "tests/test_threads.py::test_split_sequence_matches_loop_of_reference_cells",
    "tests/test_fuzz.py",
]


def core(machine: str) -> list[str]:
    """CORE for a processor (``platform.machine()``'s name), with the test
    that another processor's instruction set is refused there."""
    foreign = "avx2" if machine.lower() in ("aarch64", "arm64") else "neon"
    refused = (
        f"tests/test_cpu_isa.py::test_invalid_value_is_an_error_at_every_kernel_call[{foreign}]"
    )
    return [*CORE[:4], refused, *CORE[4:]]
