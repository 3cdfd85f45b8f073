// CPU implementation of lltm::sequence_forward and lltm::sequence_backward.
//
// Structure, mirrored by csrc/cuda/lltm_cuda_sequence.cu function for function:
//   forward:  gates = input @ W_x^T for all steps at once (one GEMM, straight
//             into the saved `gates`), then step by step: gates_t += h_prev @
//             W_h^T and the cell's pointwise pass, which adds the bias,
//             activates gates_t in place and writes output_t and cells_t.
//   backward: step by step, last first: the cell's pointwise backward into
//             d_gates_t and the gradient of c_prev, then the gradient of
//             h_prev = d_gates_t @ W_h. After the loop, over all steps at once:
//             grad_weights = d_gates^T @ [h_prev, input] (one GEMM),
//             grad_input = d_gates @ W_x (one GEMM); grad_bias is summed along
//             the way.
// Steps run on a running state: step t updates its first batch_sizes[t]
// rows, the others keep theirs, which is what a PackedSequence needs in both
// directions (lltm_ops.cpp). The per-step products are the packed kernel of
// lltm_cpu_gemm.h where there is one (float and double on AVX2/AVX-512, with
// W_h packed once per call), torch's GEMM otherwise; with several threads each
// step's rows are split between them, product and pointwise pass alike, so a
// step is one parallel region.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "../lltm_checks.h"
#include "../lltm_tensor.h"
#include "lltm_cpu_gemm.h"
#include "lltm_cpu_rows.h"
#include "lltm_cpu_torch_ops.h"

namespace lltm::cpu {
namespace {

// Below this many multiply-adds a step's product takes a few microseconds on
// one core, about what splitting it between threads costs.
constexpr int64_t kMinParallelProduct = 1 << 18;

// The steps in the order they run, and where each step's rows are.
struct Schedule {
  std::vector<int64_t> sizes;   // active batch of step t
  std::vector<int64_t> starts;  // first row of step t
  bool reverse;

  Schedule(std::vector<int64_t> batch_sizes, bool reverse_)
      : sizes(std::move(batch_sizes)), starts(sizes.size()), reverse(reverse_) {
    int64_t row = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      starts[t] = row;
      row += sizes[t];
    }
  }
  int64_t steps() const { return static_cast<int64_t>(sizes.size()); }
  // The k-th step to run.
  int64_t step(int64_t k) const { return reverse ? steps() - 1 - k : k; }
};

// Row r of a tensor laid out like the input: (steps, batch, width), rows
// counted step by step, or packed (rows, width).
template <typename S>
struct SequenceRows {
  S* data;
  int64_t batch;
  bool packed;
  int64_t stride0, stride1, stride2;

  SequenceRows(const Tensor& t, const SequenceSizes& n)
      : data(static_cast<S*>(t.data_ptr())),
        batch(n.batch),
        packed(n.packed),
        stride0(t.stride(0)),
        stride1(t.stride(1)),
        stride2(n.packed ? 0 : t.stride(2)) {}

  RowRef<S> row(int64_t r) const {
    if (packed) return {data + r * stride0, stride1};
    return {data + (r / batch) * stride0 + (r % batch) * stride1, stride2};
  }
};

// A new contiguous tensor of the input's layout with `width` columns.
Tensor new_sequence_tensor(const Tensor& like, const SequenceSizes& n, int64_t width) {
  if (n.packed) return new_matrix(like, n.rows, width);
  return new_contiguous(like, {n.steps, n.batch, width});
}

// A tensor of the input's layout as a (rows, width) matrix, for the GEMMs
// over all steps: a view where the steps and batch merge, else a copy.
Tensor as_rows(const Tensor& t, const SequenceSizes& n) {
  if (n.packed) return t;
  const int64_t steps = t.size(0), batch = t.size(1), width = t.size(2);
  if (batch == 1) return reshaped_view(t, steps, width, t.stride(0), t.stride(2));
  if (steps <= 1 || t.stride(0) == batch * t.stride(1)) {
    return reshaped_view(t, steps * batch, width, t.stride(1), t.stride(2));
  }
  return reshaped_view(torch::stable::contiguous(t), steps * batch, width, width, 1);
}

// How one step's rows are split between threads: in blocks of whole
// register tiles, as many blocks as threads when the step's product is worth
// splitting, else one block.
struct RowBlocks {
  int64_t threads;
  int64_t tile_rows;

  // fn(block, first_row, end_row) for rows [0, rows); block < threads.
  template <typename Fn>
  void run(int64_t rows, int64_t product, const Fn& fn) const {
    if (threads < 2 || product < kMinParallelProduct || rows <= tile_rows) {
      fn(int64_t(0), int64_t(0), rows);
      return;
    }
    const int64_t tiles = (rows + tile_rows - 1) / tile_rows;
    const int64_t blocks = std::min(threads, tiles);
    const int64_t block_rows = (tiles + blocks - 1) / blocks * tile_rows;
    torch::stable::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t first = b * block_rows;
        if (first < rows) fn(b, first, std::min(rows, first + block_rows));
      }
    });
  }
};

RowBlocks row_blocks() { return {std::max<int64_t>(1, torch::stable::get_num_threads()), 8}; }

// The bias in the math type, converted once per call.
template <typename scalar_t, typename T = acc_t<scalar_t>>
std::vector<T> bias_in(const Tensor& bias, int64_t size) {
  const Matrix<const scalar_t> b = row_of<const scalar_t>(bias);
  std::vector<T> out(size);
  for (int64_t k = 0; k < size; ++k) out[k] = static_cast<T>(b.data[k * b.col_stride]);
  return out;
}

template <typename scalar_t>
void sequence_forward_steps(const SequenceSizes& n, const Schedule& schedule, const Tensor& weights,
                            const Tensor& bias, const Tensor& h0, const Tensor& c0,
                            Tensor& output, Tensor& gates, Tensor& cells) {
  using T = acc_t<scalar_t>;
  const int64_t S = n.state;
  const std::vector<T> b_all = bias_in<scalar_t>(bias, 3 * S);
  scalar_t* out = static_cast<scalar_t*>(output.data_ptr());
  scalar_t* g = static_cast<scalar_t*>(gates.data_ptr());
  scalar_t* c1 = static_cast<scalar_t*>(cells.data_ptr());
  const Matrix<const scalar_t> h_init = matrix_of<const scalar_t>(h0);  // contiguous rows
  const Matrix<const scalar_t> c_init = matrix_of<const scalar_t>(c0);
  const GemmKernel<scalar_t>* packed = packed_gemm<scalar_t>();
  std::optional<PackedPanels<scalar_t>> w_h_t;
  if (packed != nullptr) {
    // B = W_h^T: B[k][j] = W[j][k], k < state, j < 3 * state.
    w_h_t.emplace(static_cast<const scalar_t*>(weights.data_ptr()), S, 3 * S,
                  weights.stride(1), weights.stride(0), packed->panel);
  }
  const Tensor w_h_transposed = transposed(column_block(weights, 0, S, false));
  const RowBlocks blocks = row_blocks();
  std::vector<const scalar_t*> row_pointers(n.batch);  // A's rows, by row

  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    const int64_t size = schedule.sizes[t];
    const int64_t start = schedule.starts[t];
    const int64_t previous = k == 0 ? 0 : schedule.sizes[schedule.step(k - 1)];
    const int64_t previous_start = k == 0 ? 0 : schedule.starts[schedule.step(k - 1)];
    // Row r's state before this step: the previous step's, or the initial.
    auto h_prev = [&](int64_t r) -> const scalar_t* {
      return r < previous ? out + (previous_start + r) * S : h_init.row(r);
    };
    auto c_prev = [&](int64_t r) -> RowRef<const scalar_t> {
      if (r < previous) return {c1 + (previous_start + r) * S, 1};
      return {c_init.row(r), c_init.col_stride};
    };
    auto pointwise = [&](int64_t first, int64_t end) {
      ForwardBuffers<T> buf;
      for (int64_t r = first; r < end; ++r) {
        const int64_t row = start + r;
        forward_row(buf, g + row * 3 * S, b_all.data(), c_prev(r), out + row * S, c1 + row * S,
                    S);
      }
    };
    if (packed != nullptr) {
      blocks.run(size, size * S * 3 * S, [&](int64_t, int64_t first, int64_t end) {
        const scalar_t** a_rows = row_pointers.data() + first;
        for (int64_t r = first; r < end; ++r) a_rows[r - first] = h_prev(r);
        packed->run(end - first, a_rows, w_h_t->data.get(), S, 3 * S,
                    g + (start + first) * 3 * S, 3 * S, /*accumulate=*/true);
        pointwise(first, end);
      });
      continue;
    }
    // torch's GEMM on contiguous blocks of previous rows: the previous
    // step's, then (going in reverse over packed sequences) rows joining now.
    const int64_t carried = std::min(size, previous);
    if (carried > 0) {
      Tensor first_rows = reshaped_view(gates, carried, 3 * S, 3 * S, 1, start * 3 * S);
      addmm_out(first_rows, first_rows,
                reshaped_view(output, carried, S, S, 1, previous_start * S), w_h_transposed, 1.0);
    }
    if (size > carried) {
      Tensor joining = reshaped_view(gates, size - carried, 3 * S, 3 * S, 1,
                                     (start + carried) * 3 * S);
      const Tensor h_rows = reshaped_view(h0, size - carried, S, h0.stride(0), h0.stride(1),
                                          carried * h0.stride(0));
      addmm_out(joining, joining, h_rows, w_h_transposed, 1.0);
    }
    if (worth_parallel(size * S)) {
      const int64_t grain = std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(S, 1));
      torch::stable::parallel_for(0, size, grain, pointwise);
    } else {
      pointwise(0, size);
    }
  }
}

// Each sequence's state after its last step (the initial one if it had none).
template <typename scalar_t>
void gather_final_state(const SequenceSizes& n, const Schedule& schedule, const Tensor& steps_data,
                        const Tensor& initial, Tensor& final_state) {
  const int64_t S = n.state;
  std::vector<int64_t> last_row(n.batch, -1);
  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    for (int64_t r = 0; r < schedule.sizes[t]; ++r) last_row[r] = schedule.starts[t] + r;
  }
  const scalar_t* from = static_cast<const scalar_t*>(steps_data.data_ptr());
  const Matrix<const scalar_t> init = matrix_of<const scalar_t>(initial);
  scalar_t* to = static_cast<scalar_t*>(final_state.data_ptr());
  for (int64_t r = 0; r < n.batch; ++r) {
    if (last_row[r] >= 0) {
      std::copy(from + last_row[r] * S, from + (last_row[r] + 1) * S, to + r * S);
    } else {
      for (int64_t j = 0; j < S; ++j) to[r * S + j] = init.row(r)[j * init.col_stride];
    }
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sequence_forward(
    Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell,
    std::optional<Tensor> batch_sizes, bool reverse) {
  const SequenceSizes n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes);
  selected_isa();  // a bad LLTM_CPU_ISA raises here, outside any parallel region
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  Tensor output = new_sequence_tensor(input, n, n.state);
  Tensor gates = new_sequence_tensor(input, n, 3 * n.state);
  Tensor cells = new_sequence_tensor(input, n, n.state);
  Tensor h_n = new_matrix(input, n.batch, n.state);
  Tensor c_n = new_matrix(input, n.batch, n.state);
  Tensor gates_rows = as_rows(gates, n);
  if (n.rows > 0 && n.state > 0) {
    // Every step's input projection at once, straight into `gates`.
    addmm_out(gates_rows, gates_rows, as_rows(input, n),
              transposed(column_block(weights, n.state, n.features, false)), 0.0);
  }
  // The GEMMs read h0 as whole rows; c0 is read in place, any strides.
  const Tensor h0 = torch::stable::contiguous(old_h);
  Tensor output_rows = as_rows(output, n);
  Tensor cells_rows = as_rows(cells, n);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_forward_cpu", AT_WRAP([&] {
                    sequence_forward_steps<scalar_t>(n, schedule, weights, bias, h0, old_cell,
                                                     output_rows, gates_rows, cells_rows);
                    gather_final_state<scalar_t>(n, schedule, output_rows, old_h, h_n);
                    gather_final_state<scalar_t>(n, schedule, cells_rows, old_cell, c_n);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);
  return {output, h_n, c_n, gates, cells};
}

// --- Backward ------------------------------------------------------------------------

// What one block of rows needs while a step runs, made once per call.
template <typename scalar_t, typename T = acc_t<scalar_t>>
struct BackwardWorkspace {
  BackwardBuffers<T> buf;
  std::vector<T> grad_h;            // one row: the gradient reaching h_t
  std::vector<scalar_t> grad_cell;  // one row: the gradient of c_prev
  std::vector<T> bias;              // d_gates summed over up to kFoldRows rows
  std::vector<double> bias_total;   // ... and over every step
  int64_t folded = 0;               // rows in `bias` not yet in bias_total

  explicit BackwardWorkspace(int64_t state)
      : grad_h(state), grad_cell(state), bias(3 * state), bias_total(3 * state) {}

  void fold() {
    for (size_t j = 0; j < bias.size(); ++j) bias_total[j] += bias[j];
    std::fill(bias.begin(), bias.end(), T(0));
    folded = 0;
  }
};

template <typename scalar_t>
void sequence_backward_steps(const SequenceSizes& n, const Schedule& schedule,
                             const std::optional<Tensor>& grad_output, const Tensor& gates,
                             const Tensor& cells, const Tensor& weights, Tensor& d_gates,
                             Tensor& grad_h, Tensor& grad_c, scalar_t* grad_bias) {
  using T = acc_t<scalar_t>;
  const int64_t S = n.state;
  const SequenceRows<const scalar_t> g(gates, n), c1(cells, n);
  std::optional<SequenceRows<const scalar_t>> dy;
  if (grad_output.has_value()) dy.emplace(*grad_output, n);
  scalar_t* dg = static_cast<scalar_t*>(d_gates.data_ptr());  // contiguous (rows, 3S)
  scalar_t* dh = static_cast<scalar_t*>(grad_h.data_ptr());   // contiguous (batch, S)
  scalar_t* dc = static_cast<scalar_t*>(grad_c.data_ptr());
  const GemmKernel<scalar_t>* packed = packed_gemm<scalar_t>();
  std::optional<PackedPanels<scalar_t>> w_h;
  if (packed != nullptr) {
    // B = W_h: B[k][j] = W[k][j], k < 3 * state, j < state.
    w_h.emplace(static_cast<const scalar_t*>(weights.data_ptr()), 3 * S, S, weights.stride(0),
                weights.stride(1), packed->panel);
  }
  const Tensor w_h_view = column_block(weights, 0, S, false);
  const RowBlocks blocks = row_blocks();
  // One workspace per block, so with the library GEMM (one block per step)
  // the pointwise pass runs in one block as well.
  std::vector<BackwardWorkspace<scalar_t>> workspaces;
  workspaces.reserve(blocks.threads);
  for (int64_t b = 0; b < blocks.threads; ++b) workspaces.emplace_back(S);
  std::vector<const scalar_t*> row_pointers(n.batch);

  // d_gates of rows [first, end) of step t and the gradient of c_prev (into
  // grad_c); their d_gates also join the workspace's grad_bias sums.
  auto pointwise = [&](BackwardWorkspace<scalar_t>& ws, int64_t start, int64_t first,
                       int64_t end) {
    T* bias = ws.bias.data();
    for (int64_t r = first; r < end; ++r) {
      const int64_t row = start + r;
      // The gradient reaching h_t: through output_t and through h_t's use by
      // the step after (in grad_h).
      for (int64_t j = 0; j < S; j += kSpan) {
        const int64_t len = std::min(kSpan, S - j);
        T* sum = ws.grad_h.data() + j;
        const T* carried = load_span(dh + r * S + j, 1, len, ws.buf.grad_h);
        std::copy(carried, carried + len, sum);
        if (dy.has_value()) {
          const RowRef<const scalar_t> y = dy->row(row);
          const T* direct = load_span(y.at(j), y.stride, len, ws.buf.grad_cell);
          for (int64_t q = 0; q < len; ++q) sum[q] += direct[q];
        }
      }
      for (int64_t j = 0; j < S; j += kSpan) {
        backward_span(ws.buf, RowRef<const T>{ws.grad_h.data(), 1},
                      RowRef<const scalar_t>{dc + r * S, 1}, c1.row(row), g.row(row),
                      dg + row * 3 * S, ws.grad_cell.data(), bias + j, bias + S + j,
                      bias + 2 * S + j, S, j, std::min(kSpan, S - j));
      }
      std::copy(ws.grad_cell.begin(), ws.grad_cell.end(), dc + r * S);
      if (++ws.folded == kFoldRows) ws.fold();
    }
  };

  for (int64_t k = schedule.steps() - 1; k >= 0; --k) {
    const int64_t t = schedule.step(k);
    const int64_t size = schedule.sizes[t];
    const int64_t start = schedule.starts[t];
    if (packed != nullptr) {
      blocks.run(size, size * 3 * S * S, [&](int64_t block, int64_t first, int64_t end) {
        pointwise(workspaces[block], start, first, end);
        const scalar_t** a_rows = row_pointers.data() + first;
        for (int64_t r = first; r < end; ++r) a_rows[r - first] = dg + (start + r) * 3 * S;
        packed->run(end - first, a_rows, w_h->data.get(), 3 * S, S, dh + first * S, S,
                    /*accumulate=*/false);
      });
      continue;
    }
    pointwise(workspaces[0], start, 0, size);
    if (size > 0) {
      Tensor dh_rows = reshaped_view(grad_h, size, S, S, 1, 0);
      addmm_out(dh_rows, dh_rows, reshaped_view(d_gates, size, 3 * S, 3 * S, 1, start * 3 * S),
                w_h_view, 0.0);
    }
  }
  if (grad_bias != nullptr) {
    for (auto& ws : workspaces) ws.fold();
    for (int64_t j = 0; j < 3 * S; ++j) {
      double total = 0;
      for (const auto& ws : workspaces) total += ws.bias_total[j];
      grad_bias[j] = static_cast<scalar_t>(total);
    }
  }
}

template <typename S>
void copy_row(RowRef<const S> from, int64_t n, S* to) {
  if (from.stride == 1) {
    std::copy(from.data, from.data + n, to);
  } else {
    for (int64_t j = 0; j < n; ++j) to[j] = *from.at(j);
  }
}

// [h_prev, input] of every row: the left factor of grad_weights.
template <typename scalar_t>
void previous_state_and_input(const SequenceSizes& n, const Schedule& schedule,
                              const Tensor& output, const Tensor& old_h, const Tensor& input,
                              Tensor& x) {
  const int64_t S = n.state, F = n.features;
  const SequenceRows<const scalar_t> y(output, n), in(input, n);
  const Matrix<const scalar_t> h0 = matrix_of<const scalar_t>(old_h);
  scalar_t* out = static_cast<scalar_t*>(x.data_ptr());
  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    const int64_t previous = k == 0 ? 0 : schedule.sizes[schedule.step(k - 1)];
    const int64_t previous_start = k == 0 ? 0 : schedule.starts[schedule.step(k - 1)];
    for (int64_t r = 0; r < schedule.sizes[t]; ++r) {
      scalar_t* row = out + (schedule.starts[t] + r) * (S + F);
      const RowRef<const scalar_t> h =
          r < previous ? y.row(previous_start + r) : RowRef<const scalar_t>{h0.row(r), h0.col_stride};
      copy_row(h, S, row);
      copy_row(in.row(schedule.starts[t] + r), F, row + S);
    }
  }
}

using Grads = std::tuple<std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                         std::optional<Tensor>, std::optional<Tensor>>;

Grads sequence_backward(std::optional<Tensor> grad_output, std::optional<Tensor> grad_h_n,
                        std::optional<Tensor> grad_c_n, Tensor output, Tensor gates, Tensor cells,
                        Tensor input, Tensor weights, Tensor old_h,
                        std::optional<Tensor> batch_sizes, bool reverse,
                        std::vector<bool> output_mask) {
  const SequenceSizes n = check_sequence_backward_args(grad_output, grad_h_n, grad_c_n, output,
                                                       gates, cells, input, weights, old_h,
                                                       batch_sizes);
  const GradMask want = check_output_mask(output_mask);
  selected_isa();  // a bad LLTM_CPU_ISA raises here, outside any parallel region
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const int64_t S = n.state;
  // The running gradients of the state, which end as those of old_h, old_cell.
  Tensor grad_h = new_matrix(input, n.batch, S);
  Tensor grad_c = new_matrix(input, n.batch, S);
  Tensor d_gates = new_matrix(input, n.rows, 3 * S);
  std::optional<Tensor> grad_bias;
  if (want.bias) grad_bias = new_vector(weights, 3 * S);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_backward_cpu", AT_WRAP([&] {
                    for (auto [from, to] : {std::pair{&grad_h_n, &grad_h}, {&grad_c_n, &grad_c}}) {
                      scalar_t* d = static_cast<scalar_t*>(to->data_ptr());
                      if (!from->has_value()) {
                        std::fill(d, d + n.batch * S, scalar_t(0));
                      } else if (n.batch * S > 0) {
                        copy_columns(*to, **from, 0);
                      }
                    }
                    sequence_backward_steps<scalar_t>(
                        n, schedule, grad_output, gates, cells, weights, d_gates, grad_h, grad_c,
                        grad_bias ? static_cast<scalar_t*>(grad_bias->data_ptr()) : nullptr);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);

  std::optional<Tensor> grad_input, grad_weights;
  if (want.weights) {
    grad_weights = new_matrix(weights, 3 * S, S + n.features);
    Tensor x = new_matrix(input, n.rows, S + n.features);
    THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_grad_weights_cpu", AT_WRAP([&] {
                      previous_state_and_input<scalar_t>(n, schedule, output, old_h, input, x);
                    }),
                    AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                    torch::headeronly::ScalarType::BFloat16);
    addmm_out(*grad_weights, *grad_weights, transposed(d_gates), x, 0.0);
  }
  if (want.input) {
    grad_input = new_sequence_tensor(input, n, n.features);
    Tensor rows = as_rows(*grad_input, n);
    addmm_out(rows, rows, d_gates, column_block(weights, S, n.features, false), 0.0);
  }
  return {grad_input, grad_weights, grad_bias,
          want.old_h ? std::optional<Tensor>(grad_h) : std::nullopt,
          want.old_cell ? std::optional<Tensor>(grad_c) : std::nullopt};
}

}  // namespace
}  // namespace lltm::cpu

STABLE_TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  m.impl("sequence_forward", TORCH_BOX(&lltm::cpu::sequence_forward));
  m.impl("sequence_backward", TORCH_BOX(&lltm::cpu::sequence_backward));
}
