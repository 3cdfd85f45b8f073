#!/usr/bin/env bash
# The runs behind benchmarks/RESULTS.md, one JSON each in benchmarks/data/;
# `python benchmarks/render.py data/FILE.json` turns one back into its table
# (and with --plot into its figure). Needs lltm installed (e.g. `nox -s bench`
# builds it; or an in-place build with PYTHONPATH=src) and matplotlib. Takes
# about an hour on 2 cores; keep the machine otherwise idle.
set -euo pipefail
cd "$(dirname "$0")"
bench() { python -m lltm bench -q "$@"; }

for threads in 1 2; do
  # One cell step, the tutorial's configuration first (inputs need no grad).
  bench --threads "$threads" --impl all --json "data/cell_tutorial_${threads}thread.json"
  bench --threads "$threads" --impl all --inputs-grad \
    --json "data/cell_tutorial_inputs_grad_${threads}thread.json"
  bench -b 256 -f 1024 -s 1024 --threads "$threads" --impl reference,lltm,gemm -r 5 \
    --json "data/cell_large_${threads}thread.json"
  bench -b 256 -f 1024 -s 1024 --threads "$threads" --impl reference,lltm,gemm -r 5 \
    --inputs-grad --json "data/cell_large_inputs_grad_${threads}thread.json"
  # Whole sequences, T = 50.
  bench --seq-len 50 --threads "$threads" --impl all -r 9 \
    --json "data/sequence_tutorial_${threads}thread.json"
  bench --seq-len 50 --threads "$threads" --impl all -r 9 --inputs-grad \
    --json "data/sequence_tutorial_inputs_grad_${threads}thread.json"
  bench -b 64 -f 256 -s 512 --seq-len 50 --threads "$threads" \
    --impl reference-loop,lltm-sequence,lstm,gemm -r 3 \
    --json "data/sequence_large_${threads}thread.json"
done
# Time against sequence length, with its plot.
bench --seq-len 1,5,10,25,50,100 --threads 1 --impl all -r 5 \
  --json data/sequence_lengths_1thread.json
python render.py data/sequence_lengths_1thread.json --plot sequence_lengths_1thread.png >/dev/null

# Per-sample gradients, 32 samples of T = 50 at the tutorial's size: five runs
# per thread count, taking turns, since one run's ratios move by tens of per
# cent on a shared machine.
for run in 1 2 3 4 5; do
  for threads in 1 2; do
    bench --per-sample --threads "$threads" --impl all \
      --json "data/per_sample_tutorial_${threads}thread_run${run}.json"
  done
done
# Per-sample gradients against the number of samples, with its plot.
bench --per-sample --sizes 1x32x128,4x32x128,8x32x128,16x32x128,32x32x128,64x32x128,128x32x128 \
  --threads 1 --impl lltm-loop,lltm-vmap,lltm-batched -r 9 \
  --json data/per_sample_samples_1thread.json
python render.py data/per_sample_samples_1thread.json --plot per_sample_samples_1thread.png >/dev/null
