// The fused pointwise kernels of lltm's CUDA implementation and their
// launchers, shared by the cell (lltm_cuda.cu) and the sequence
// (lltm_cuda_sequence.cu): the device twins of csrc/cpu/lltm_cpu_rows.h.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

using torch::stable::Tensor;

// Row r of gates starts at r * 3 * state; its three gate blocks are `state`
// apart. Every other matrix has rows of `state` elements.
template <typename scalar_t, int kVec>
__global__ void forward_kernel(scalar_t* __restrict__ gates, const scalar_t* __restrict__ old_cell,
                               scalar_t* __restrict__ new_h, scalar_t* __restrict__ new_cell,
                               int64_t batch, int64_t state) {
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

template <typename scalar_t, int kVec>
__global__ void backward_kernel(const scalar_t* __restrict__ grad_h,
                                const scalar_t* __restrict__ grad_cell,
                                const scalar_t* __restrict__ new_cell,
                                const scalar_t* __restrict__ gates, scalar_t* __restrict__ d_gates,
                                scalar_t* __restrict__ grad_old_cell, int64_t batch,
                                int64_t state) {
  using P = Pack<scalar_t, kVec>;
  for_each_pack<kVec>(batch, state, [&](int64_t row, int64_t j) {
    const scalar_t* g = gates + row * 3 * state;
    const int64_t e = row * state + j;
    const P dh = load_pack<kVec>(grad_h + e);
    const P dc = load_pack<kVec>(grad_cell + e);
    const P c1 = load_pack<kVec>(new_cell + e);
    const P i = load_pack<kVec>(g + j);
    const P o = load_pack<kVec>(g + state + j);
    const P x = load_pack<kVec>(g + 2 * state + j);
    P d_i, d_o, d_c, dc0;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      backward_element(dh.v[k], dc.v[k], c1.v[k], i.v[k], o.v[k], x.v[k], d_i.v[k], d_o.v[k],
                       d_c.v[k], dc0.v[k]);
    }
    scalar_t* dg = d_gates + row * 3 * state;
    store_pack<kVec>(dg + j, d_i);
    store_pack<kVec>(dg + state + j, d_o);
    store_pack<kVec>(dg + 2 * state + j, d_c);
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
  if (rows_fit_wide_packs<scalar_t>(state, {g, c0, h1, c1})) {
    const RowTiling t = row_tiling(batch, state / kVec, device);
    LLTM_LAUNCH(t.grid, t.block, stream, forward_kernel<scalar_t, kVec>)(g, c0, h1, c1, batch,
                                                                         state);
  } else {
    const RowTiling t = row_tiling(batch, state, device);
    LLTM_LAUNCH(t.grid, t.block, stream, forward_kernel<scalar_t, 1>)(g, c0, h1, c1, batch, state);
  }
  check_launch("lltm forward_kernel");
}

template <typename scalar_t>
void backward_pointwise(const Tensor& grad_h, const Tensor& grad_cell, const Tensor& new_cell,
                        const Tensor& gates, Tensor& d_gates, Tensor& grad_old_cell, int64_t batch,
                        int64_t state) {
  if (batch == 0 || state == 0) return;
  const scalar_t* dh = grad_h.const_data_ptr<scalar_t>();
  const scalar_t* dc = grad_cell.const_data_ptr<scalar_t>();
  const scalar_t* c1 = new_cell.const_data_ptr<scalar_t>();
  const scalar_t* g = gates.const_data_ptr<scalar_t>();
  scalar_t* dg = d_gates.mutable_data_ptr<scalar_t>();
  scalar_t* dc0 = grad_old_cell.mutable_data_ptr<scalar_t>();
  const int32_t device = gates.get_device_index();
  const cudaStream_t stream = current_stream(device);
  constexpr int kVec = kWidePack<scalar_t>;
  if (rows_fit_wide_packs<scalar_t>(state, {dh, dc, c1, g, dg, dc0})) {
    const RowTiling t = row_tiling(batch, state / kVec, device);
    LLTM_LAUNCH(t.grid, t.block, stream, backward_kernel<scalar_t, kVec>)(dh, dc, c1, g, dg, dc0,
                                                                          batch, state);
  } else {
    const RowTiling t = row_tiling(batch, state, device);
    LLTM_LAUNCH(t.grid, t.block, stream, backward_kernel<scalar_t, 1>)(dh, dc, c1, g, dg, dc0,
                                                                       batch, state);
  }
  check_launch("lltm backward_kernel");
}

}  // namespace lltm::cuda
