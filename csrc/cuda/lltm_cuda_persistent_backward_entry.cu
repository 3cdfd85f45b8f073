// The persistent sequence backward as sequence_backward calls it
// (lltm_cuda_persistent.h): its kernels, their occupancy for the rule, and
// the launch of a call's plan.
#include "lltm_cuda_persistent_backward.cuh"
#include "lltm_cuda_persistent_launch.cuh"

namespace lltm::cuda {
namespace {

using persistent::BackwardArgs;

template <typename T>
using BackwardKernel = void (*)(BackwardArgs<T>);

// The kernel of a plan's mode and tile height, as forward_kernel picks it
// (float32's tensor-core plans: the kernel of 1 row).
template <typename T>
BackwardKernel<T> backward_kernel(SequencePath path, int tile_rows) {
  using persistent::sequence_backward_kernel;
  if constexpr (sizeof(T) == 2) {
    if (tile_rows == kTensorCoreTileRows) {
      return path == SequencePath::kCluster
                 ? sequence_backward_kernel<T, kTensorCoreTileRows, ClusterExchange>
                 : sequence_backward_kernel<T, kTensorCoreTileRows, GridExchange>;
    }
  }
  if (path == SequencePath::kCluster) {
    return tile_rows == 4 ? sequence_backward_kernel<T, 4, ClusterExchange>
                          : sequence_backward_kernel<T, 1, ClusterExchange>;
  }
  return tile_rows == 4 ? sequence_backward_kernel<T, 4, GridExchange>
                        : sequence_backward_kernel<T, 1, GridExchange>;
}

template <typename T>
bool backward_launch(const SequencePlan& plan, const SequenceSizes& n, const Steps& steps,
                     bool reverse, const std::optional<Tensor>& grad_output,
                     const std::optional<Tensor>& grad_h_n, const std::optional<Tensor>& grad_c_n,
                     const Tensor& gates, const Tensor& cells, const Tensor& weights,
                     Tensor& d_gates, Tensor* grad_h, Tensor& grad_c,
                     std::optional<Tensor>* bias_sums) {
  using Math = acc_t<T>;
  BackwardArgs<T> args{};
  if (grad_output.has_value()) {
    args.grad_output = grad_output->const_data_ptr<T>();
    persistent::GradOutputStrides& strides = args.grad_output_strides;
    if (n.packed) {  // (input rows, S)
      strides.by_input_row = grad_output->stride(0);
      strides.by_row = grad_output->stride(0);
      strides.by_unit = grad_output->stride(1);
    } else {  // (steps, batch, S)
      strides.by_time = grad_output->stride(0);
      strides.by_row = grad_output->stride(1);
      strides.by_unit = grad_output->stride(2);
    }
  }
  // The final states' gradients, read through their strides: a broadcast
  // one (from h_n.sum()) is never copied dense.
  if (grad_h_n.has_value()) {
    args.grad_h_n = grad_h_n->const_data_ptr<T>();
    args.grad_h_n_strides = {grad_h_n->stride(0), grad_h_n->stride(1)};
  }
  if (grad_c_n.has_value()) {
    args.grad_c_n = grad_c_n->const_data_ptr<T>();
    args.grad_c_n_strides = {grad_c_n->stride(0), grad_c_n->stride(1)};
  }
  args.gates = gates.const_data_ptr<T>();
  args.cells = cells.const_data_ptr<T>();
  args.d_gates = d_gates.mutable_data_ptr<T>();
  args.grad_h = grad_h != nullptr ? grad_h->mutable_data_ptr<T>() : nullptr;
  args.grad_c = grad_c.mutable_data_ptr<T>();
  // Cooperative: the blocks' shares of the gradient of h in global memory,
  // two steps' worth (see the kernel), in the math type.
  std::optional<Tensor> shares;
  if (plan.path == SequencePath::kCooperative) {
    const int64_t rows = 2 * int64_t(plan.blocks) * n.batch;
    shares = persistent::kWidened<T> ? new_float_matrix(gates, rows, n.state)
                                     : new_matrix(gates, rows, n.state);
    args.shares = shares->mutable_data_ptr<Math>();
  }
  if constexpr (persistent::kWidened<T>) {
    if (bias_sums != nullptr) {
      *bias_sums = new_float_matrix(gates, n.batch, 3 * n.state);
      args.bias_sums = (*bias_sums)->mutable_data_ptr<Math>();
    }
  }
  args.weights = weights.const_data_ptr<T>();
  args.weights_row_stride = weights.stride(0);
  args.weights_column_stride = weights.stride(1);
  args.batch_size = n.batch;
  args.state_size = n.state;
  args.units_per_block = plan.units;
  args.rows_per_group = plan.group_rows;
  args.pitch = plan.pitch;
  args.tf32 = plan.tf32;
  args.layout = plan.layout;
  args.reverse = reverse;
  args.steps = steps;
  // `shares` is freed after the launch is queued: torch's caching allocator
  // hands its memory out again only to work queued after it on this stream.
  return launch_waves(backward_kernel<T>(plan.path, plan.tile_rows), plan, args, n.batch,
                      gates.get_device_index(), "lltm sequence_backward_kernel");
}

}  // namespace

int backward_blocks_per_multiprocessor(int device, int element_size, int tile_rows, int threads,
                                       int64_t shared_bytes) {
  return with_element_size(element_size, [&](auto type) {
    return blocks_per_multiprocessor_of(
        backward_kernel<decltype(type)>(SequencePath::kCooperative, tile_rows), device, threads,
        shared_bytes);
  });
}

int backward_active_clusters(int device, int element_size, int tile_rows, int cluster_size,
                             int groups, int threads, int64_t shared_bytes) {
  return with_element_size(element_size, [&](auto type) {
    return active_clusters_of(backward_kernel<decltype(type)>(SequencePath::kCluster, tile_rows),
                              device, cluster_size, groups, threads, shared_bytes);
  });
}

bool persistent_sequence_backward(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& weights, Tensor& d_gates,
                                  Tensor* grad_h, Tensor& grad_c, std::optional<Tensor>* bias_sums,
                                  bool tf32) {
  const int element_size = element_size_of(gates);
  const int device = gates.get_device_index();
  const SequencePlan plan =
      plan_for(SequencePass::kBackward, device, element_size, n.batch, n.state, tf32);
  if (!plan.persistent()) return false;
  const std::optional<Steps> steps = steps_of(schedule, n.rows);
  if (!steps) return false;
  return with_dtype(gates, [&](auto type) {
    return backward_launch<decltype(type)>(plan, n, *steps, schedule.reverse, grad_output, grad_h_n,
                                           grad_c_n, gates, cells, weights, d_gates, grad_h, grad_c,
                                           bias_sums);
  });
}

}  // namespace lltm::cuda
