// The fused pointwise kernels of lltm's CUDA implementation and their
// launchers, shared by the cell (lltm_cuda.cu) and the sequence
// (lltm_cuda_sequence_*.cu): the device twins of csrc/cpu/pointwise/row_passes.h.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

using torch::stable::Tensor;

// Row r of gates starts at r * 3 * state; its three gate blocks are `state`
// apart. Every other matrix has rows of `state` elements. old_cell and
// new_cell may be the same memory (the sequence's inference keeps its
// running cell in c_n, updated in place): each element of it is read, then
// written, by one thread alone, hence no __restrict__ on those two.
template <typename scalar_t, int kVec>
__global__ void forward_kernel(scalar_t* __restrict__ gates, const scalar_t* old_cell,
                               scalar_t* __restrict__ new_h, scalar_t* new_cell, int64_t batch,
                               int64_t state) {
  using P = Pack<scalar_t, kVec>;
  for_each_pack<kVec>(batch, state, [&](int64_t row, int64_t j) {
    scalar_t* g = gates + row * 3 * state;
    const int64_t e = row * state + j;
    P i = load_pack<kVec>(g + j);
    P o = load_pack<kVec>(g + state + j);
    const P x = load_pack<kVec>(g + 2 * state + j);
    const P c0 = load_pack<kVec>(old_cell + e);
    P h1, c1;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      forward_element(i.v[k], o.v[k], x.v[k], c0.v[k], h1.v[k], c1.v[k]);
    }
    store_pack<kVec>(g + j, i);
    store_pack<kVec>(g + state + j, o);
    store_pack<kVec>(new_h + e, h1);
    store_pack<kVec>(new_cell + e, c1);
  });
}

// Where a row of d_gates goes: the gradients rounded to scalar_t (for the
// GEMMs) and, for 16-bit types when grad_bias is wanted, the same gradients
// in float32 before rounding (`math`, else null), which grad_bias sums, as
// the CPU kernels and the composite do: summing the rounded ones would add
// up their rounding errors.
template <typename scalar_t, int kVec>
__device__ __forceinline__ void store_d_gates(scalar_t* d_gates, acc_t<scalar_t>* math,
                                              int64_t offset, int64_t state,
                                              const Pack<acc_t<scalar_t>, kVec> (&d)[3]) {
#pragma unroll
  for (int gate = 0; gate < 3; ++gate) {
    Pack<scalar_t, kVec> rounded;
#pragma unroll
    for (int k = 0; k < kVec; ++k) rounded.v[k] = d[gate].v[k];
    store_pack<kVec>(d_gates + offset + gate * state, rounded);
    if (math != nullptr) store_pack<kVec>(math + offset + gate * state, d[gate]);
  }
}

template <typename scalar_t, int kVec>
__global__ void backward_kernel(const scalar_t* __restrict__ grad_h,
                                const scalar_t* __restrict__ grad_cell,
                                const scalar_t* __restrict__ new_cell,
                                const scalar_t* __restrict__ gates, scalar_t* __restrict__ d_gates,
                                acc_t<scalar_t>* __restrict__ d_gates_math,
                                scalar_t* __restrict__ grad_old_cell, int64_t batch,
                                int64_t state) {
  using P = Pack<scalar_t, kVec>;
  using T = acc_t<scalar_t>;
  for_each_pack<kVec>(batch, state, [&](int64_t row, int64_t j) {
    const scalar_t* g = gates + row * 3 * state;
    const int64_t e = row * state + j;
    const P dh = load_pack<kVec>(grad_h + e);
    const P dc = load_pack<kVec>(grad_cell + e);
    const P c1 = load_pack<kVec>(new_cell + e);
    const P i = load_pack<kVec>(g + j);
    const P o = load_pack<kVec>(g + state + j);
    const P x = load_pack<kVec>(g + 2 * state + j);
    Pack<T, kVec> d[3];
    P dc0;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      T d_c;
      backward_math<T>(T(dh.v[k]), T(dc.v[k]), T(c1.v[k]), T(i.v[k]), T(o.v[k]), T(x.v[k]),
                       d[0].v[k], d[1].v[k], d[2].v[k], d_c);
      dc0.v[k] = d_c;
    }
    store_d_gates<scalar_t, kVec>(d_gates, d_gates_math, row * 3 * state + j, state, d);
    store_pack<kVec>(grad_old_cell + e, dc0);
  });
}

// Launch helpers: a launch written inside a THO_DISPATCH_V2 body breaks the
// macro, so each dtype's launch lives in these templates.
template <typename scalar_t>
void forward_pointwise(Tensor& gates, const Tensor& old_cell, Tensor& new_h, Tensor& new_cell,
                       int64_t batch, int64_t state) {
  if (batch == 0 || state == 0) return;
  scalar_t* g = gates.mutable_data_ptr<scalar_t>();
  const scalar_t* c0 = old_cell.const_data_ptr<scalar_t>();
  scalar_t* h1 = new_h.mutable_data_ptr<scalar_t>();
  scalar_t* c1 = new_cell.mutable_data_ptr<scalar_t>();
  const int32_t device = gates.get_device_index();
  const cudaStream_t stream = current_stream(device);
  constexpr int kVec = kWidePack<scalar_t>;
  cudaError_t error;
  if (rows_fit_wide_packs<scalar_t>(state, {g, c0, h1, c1})) {
    const RowTiling t = row_tiling(batch, state / kVec, device);
    error = LLTM_LAUNCH(t.grid, t.block, stream, forward_kernel<scalar_t, kVec>)(g, c0, h1, c1,
                                                                                 batch, state);
  } else {
    const RowTiling t = row_tiling(batch, state, device);
    error = LLTM_LAUNCH(t.grid, t.block, stream, forward_kernel<scalar_t, 1>)(g, c0, h1, c1, batch,
                                                                              state);
  }
  check_launch("lltm forward_kernel", error);
}

// d_gates_math: see store_d_gates (null: not wanted).
template <typename scalar_t>
void backward_pointwise(const Tensor& grad_h, const Tensor& grad_cell, const Tensor& new_cell,
                        const Tensor& gates, Tensor& d_gates, Tensor* d_gates_math,
                        Tensor& grad_old_cell, int64_t batch, int64_t state) {
  if (batch == 0 || state == 0) return;
  using T = acc_t<scalar_t>;
  const scalar_t* dh = grad_h.const_data_ptr<scalar_t>();
  const scalar_t* dc = grad_cell.const_data_ptr<scalar_t>();
  const scalar_t* c1 = new_cell.const_data_ptr<scalar_t>();
  const scalar_t* g = gates.const_data_ptr<scalar_t>();
  scalar_t* dg = d_gates.mutable_data_ptr<scalar_t>();
  T* dgm = d_gates_math ? d_gates_math->mutable_data_ptr<T>() : nullptr;
  scalar_t* dc0 = grad_old_cell.mutable_data_ptr<scalar_t>();
  const int32_t device = gates.get_device_index();
  const cudaStream_t stream = current_stream(device);
  constexpr int kVec = kWidePack<scalar_t>;
  // d_gates_math is a new float32 tensor: aligned for any pack.
  cudaError_t error;
  if (rows_fit_wide_packs<scalar_t>(state, {dh, dc, c1, g, dg, dc0})) {
    const RowTiling t = row_tiling(batch, state / kVec, device);
    error = LLTM_LAUNCH(t.grid, t.block, stream, backward_kernel<scalar_t, kVec>)(
        dh, dc, c1, g, dg, dgm, dc0, batch, state);
  } else {
    const RowTiling t = row_tiling(batch, state, device);
    error = LLTM_LAUNCH(t.grid, t.block, stream, backward_kernel<scalar_t, 1>)(
        dh, dc, c1, g, dg, dgm, dc0, batch, state);
  }
  check_launch("lltm backward_kernel", error);
}

}  // namespace lltm::cuda
