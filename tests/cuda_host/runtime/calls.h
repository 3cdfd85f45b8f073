// What the CUDA sources ask of the GPU and of torch, counted by name, so that
// a test can hold a call to a number of device operations: kernel launches
// (LLTM_LAUNCH, cudaLaunchKernelEx), queries of the GPU (cudaDeviceGetAttribute,
// cudaOccupancyMaxActiveBlocksPerMultiprocessor, cudaOccupancyMaxActiveClusters,
// cudaFuncSetAttribute, cudaFuncGetAttributes: counted where the emulation
// defines them) and the calls of torch's C shim that make work or tensors
// (allocations, views, GEMMs, and each operator called through torch's
// dispatcher by its name, e.g. "aten::copy_"). The shim's queries (sizes,
// strides, data pointers, dtypes) are not counted. The shim's allocations are
// also recorded with their sizes and dtypes (take_allocations), so that a
// test can see which tensors a call makes.
//
// Counted by renaming: after this header, the shim's functions that the CUDA
// sources (and torch's stable headers they include, torch/csrc/stable/ops.h)
// call are macros for the counting functions below, as the CUDA GEMM was
// already mapped to the CPU's. Every file of the host build includes
// runtime.h, and with it this header, before any of those; the shim's own
// headers are included here first, so that no declaration of theirs is read
// under the new names.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_aten.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/stable/c/shim.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lltm::cuda_host {

// One more call of `name` (calls.cpp; thread-safe); the clock below
// advances by its cost.
void count_call(const std::string& name);

// The emulated GPU's clock, for the CUDA events that time work queued on a
// stream (gpu.h): microseconds of work queued so far, which advance by the
// cost a test sets per name (set_costs) at each call counted under that
// name, and at each charge() of a name that is not counted (a finer name
// for a launch: "cudaLaunchKernelEx/cooperative", "cudaLaunchKernelEx/cluster").
// Names without a cost take no time; reset() clears the costs, not the clock.
void charge(const std::string& name);
double clock_us();
void set_costs(std::map<std::string, double> costs);

// Every name counted so far, with its count (never reset: tests take
// differences).
std::map<std::string, int64_t> calls();

// A tensor the CUDA sources allocated through the shim: its sizes and dtype
// (the shim's code).
struct Allocation {
  std::vector<int64_t> sizes;
  int32_t dtype;
};

// One more allocation (calls.cpp; thread-safe).
void record_allocation(int64_t ndim, const int64_t* sizes, int32_t dtype);

// The allocations recorded since the last call, in order; the record starts
// again empty (and drops what it holds past 65,536 entries, so that a process
// that never reads it stays small).
std::vector<Allocation> take_allocations();

// The emulated cuBLAS's GEMM (cublas.cpp): torch's CPU addmm, its float32
// operands rounded to TF32 first where torch's setting lets cuBLAS use TF32
// (torch.backends.cuda.matmul) and the emulated GPU has it (compute
// capability 8.0 on), as cuBLAS runs it there.
AOTITorchError cublas_addmm_out(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat1,
                                AtenTensorHandle mat2, double beta, double alpha);

// The emulated GPU's compute capability, major (gpu.h; launch.cpp).
int capability_major();

// The counting twins of the shim's functions.
namespace counted {

inline AOTITorchError empty_strided(int64_t ndim, const int64_t* sizes, const int64_t* strides,
                                    int32_t dtype, int32_t device_type, int32_t device_index,
                                    AtenTensorHandle* out) {
  count_call("aoti_torch_empty_strided");
  record_allocation(ndim, sizes, dtype);
  return ::aoti_torch_empty_strided(ndim, sizes, strides, dtype, device_type, device_index, out);
}

inline AOTITorchError reinterpret_tensor(AtenTensorHandle self, int64_t ndim, const int64_t* sizes,
                                         const int64_t* strides, int64_t storage_offset,
                                         AtenTensorHandle* out) {
  count_call("aoti_torch__reinterpret_tensor");
  return ::aoti_torch__reinterpret_tensor(self, ndim, sizes, strides, storage_offset, out);
}

inline AOTITorchError fill(AtenTensorHandle self, double value) {
  count_call("aoti_torch_aten_fill__Scalar");
  return ::aoti_torch_aten_fill__Scalar(self, value);
}

// The CUDA GEMM, run by the emulated cuBLAS (cublas_addmm_out).
inline AOTITorchError addmm_out(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat1,
                                AtenTensorHandle mat2, double beta, double alpha) {
  count_call("aoti_torch_cuda_addmm_out");
  return cublas_addmm_out(out, self, mat1, mat2, beta, alpha);
}

inline AOTITorchError dispatcher_call(const char* op, const char* overload, StableIValue* stack,
                                      uint64_t extension_build_version) {
  count_call(std::string(op) + (overload[0] != '\0' ? std::string(".") + overload : ""));
  return ::torch_call_dispatcher(op, overload, stack, extension_build_version);
}

}  // namespace counted
}  // namespace lltm::cuda_host

#define aoti_torch_empty_strided ::lltm::cuda_host::counted::empty_strided
#define aoti_torch__reinterpret_tensor ::lltm::cuda_host::counted::reinterpret_tensor
#define aoti_torch_aten_fill__Scalar ::lltm::cuda_host::counted::fill
#define aoti_torch_cuda_addmm_out ::lltm::cuda_host::counted::addmm_out
#define torch_call_dispatcher ::lltm::cuda_host::counted::dispatcher_call
