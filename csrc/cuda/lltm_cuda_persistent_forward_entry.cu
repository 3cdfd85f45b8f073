// The persistent sequence forward as sequence_forward and
// sequence_inference call it (lltm_cuda_persistent.h): its kernels, their
// occupancy for the rule, and the launch of a call's plan.
#include "lltm_cuda_persistent_forward.cuh"
#include "lltm_cuda_persistent_launch.cuh"

namespace lltm::cuda {
namespace {

using persistent::ForwardArgs;

template <typename T>
using ForwardKernel = void (*)(ForwardArgs<T>);

// The kernel of a plan's mode and tile height: 1 or 4 rows, products on the
// CUDA cores; kTensorCoreTileRows, on the tensor cores: 16-bit dtypes' own
// kernel, float32's (in TF32) that of 1 row, which switches to them at run
// time (persistent::kTf32Switch).
template <typename T>
ForwardKernel<T> forward_kernel(SequencePath path, int tile_rows) {
  using persistent::sequence_forward_kernel;
  if constexpr (sizeof(T) == 2) {
    if (tile_rows == kTensorCoreTileRows) {
      return path == SequencePath::kCluster
                 ? sequence_forward_kernel<T, kTensorCoreTileRows, ClusterExchange>
                 : sequence_forward_kernel<T, kTensorCoreTileRows, GridExchange>;
    }
  }
  if (path == SequencePath::kCluster) {
    return tile_rows == 4 ? sequence_forward_kernel<T, 4, ClusterExchange>
                          : sequence_forward_kernel<T, 1, ClusterExchange>;
  }
  return tile_rows == 4 ? sequence_forward_kernel<T, 4, GridExchange>
                        : sequence_forward_kernel<T, 1, GridExchange>;
}

template <typename T>
bool forward_launch(const SequencePlan& plan, const SequenceSizes& n, const Steps& steps,
                    bool reverse, const Tensor& projection, Tensor* gates, Tensor& output,
                    Tensor* cells, Tensor& h_n, Tensor& c_n, const Tensor& weights,
                    const Tensor& h0, const Tensor& c0) {
  ForwardArgs<T> args{};
  args.projection = projection.const_data_ptr<acc_t<T>>();
  // Both or neither (sequence_inference): the kernel tests `gates` alone.
  args.gates = gates != nullptr && cells != nullptr ? gates->mutable_data_ptr<T>() : nullptr;
  args.cells = args.gates != nullptr ? cells->mutable_data_ptr<T>() : nullptr;
  args.output = output.mutable_data_ptr<T>();
  args.h_n = h_n.mutable_data_ptr<T>();
  args.c_n = c_n.mutable_data_ptr<T>();
  args.weights = weights.const_data_ptr<T>();
  args.weights_row_stride = weights.stride(0);
  args.weights_column_stride = weights.stride(1);
  args.h0 = h0.const_data_ptr<T>();
  args.c0 = c0.const_data_ptr<T>();
  // Cooperative, 16-bit or h read from global memory: h in the math type
  // through global memory, two steps' worth (see the kernel; where the
  // products read it there, rows padded to whole 32-byte vectors); freed
  // after the launch is queued, as `shares` below.
  std::optional<Tensor> h_exchange;
  args.h_exchange_pitch = plan.h_from_global ? plan_ceil_div(n.state, 8) * 8 : n.state;
  if (plan.path == SequencePath::kCooperative && (persistent::kWidened<T> || plan.h_from_global)) {
    const int64_t columns = args.h_exchange_pitch;
    h_exchange = persistent::kWidened<T> ? new_float_matrix(output, 2 * n.batch, columns)
                                         : new_matrix(output, 2 * n.batch, columns);
    args.h_exchange = h_exchange->mutable_data_ptr<acc_t<T>>();
  }
  args.h_from_global = plan.h_from_global;
  args.batch_size = n.batch;
  args.state_size = n.state;
  args.units_per_block = plan.units;
  args.rows_per_group = plan.group_rows;
  args.pitch = plan.pitch;
  args.dot_split = plan.split;
  args.tf32 = plan.tf32;
  args.layout = plan.layout;
  args.reverse = reverse;
  args.steps = steps;
  return launch_waves(forward_kernel<T>(plan.path, plan.tile_rows), plan, args, n.batch,
                      output.get_device_index(), "lltm sequence_forward_kernel");
}

}  // namespace

int forward_blocks_per_multiprocessor(int device, int element_size, int tile_rows, int threads,
                                      int64_t shared_bytes) {
  return with_element_size(element_size, [&](auto type) {
    return blocks_per_multiprocessor_of(
        forward_kernel<decltype(type)>(SequencePath::kCooperative, tile_rows), device, threads,
        shared_bytes);
  });
}

int forward_active_clusters(int device, int element_size, int tile_rows, int cluster_size,
                            int groups, int threads, int64_t shared_bytes) {
  return with_element_size(element_size, [&](auto type) {
    return active_clusters_of(forward_kernel<decltype(type)>(SequencePath::kCluster, tile_rows),
                              device, cluster_size, groups, threads, shared_bytes);
  });
}

bool persistent_sequence_forward(const SequenceSizes& n, const Schedule& schedule,
                                 const Tensor& projection, Tensor* gates, Tensor& output,
                                 Tensor* cells, Tensor& h_n, Tensor& c_n, const Tensor& weights,
                                 const Tensor& h0, const Tensor& c0, bool tf32) {
  // The plan, as every choice here, by the output: the same with or without
  // gates and cells.
  const int element_size = element_size_of(output);
  const int device = output.get_device_index();
  const SequencePlan plan =
      plan_for(SequencePass::kForward, device, element_size, n.batch, n.state, tf32);
  if (!plan.persistent()) return false;
  const std::optional<Steps> steps = steps_of(schedule, n.rows);
  if (!steps) return false;
  return with_dtype(output, [&](auto type) {
    return forward_launch<decltype(type)>(plan, n, *steps, schedule.reverse, projection, gates,
                                          output, cells, h_n, c_n, weights, h0, c0);
  });
}

bool persistent_sequence_forward_planned(const SequenceSizes& n, const Schedule& schedule,
                                         const Tensor& like, bool tf32) {
  return plan_for(SequencePass::kForward, like.get_device_index(), element_size_of(like), n.batch,
                  n.state, tf32)
             .persistent() &&
         steps_of(schedule, n.rows).has_value();
}

}  // namespace lltm::cuda
