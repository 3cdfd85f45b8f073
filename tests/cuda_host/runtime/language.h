// CUDA C++ as the host compiler sees it in the host build: the function
// qualifiers defined away, dim3 and uint3, and the built-in variables.
//
// There is deliberately no __shared__: a static shared variable would be one
// object for every block (or, inside a function, one per thread), never the
// block's own. Kernels take shared memory from lltm::cuda::
// dynamic_shared_memory(), which has an arena per block here.
#pragma once

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The thread being run. One host thread runs all the threads of a grid: in
// turn for a plain launch, as fibers for cudaLaunchKernelEx, which set these
// each time a fiber resumes.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
