// The CUDA runtime's error codes and messages, as the host build's emulation
// returns them (values and texts of CUDA 13's driver_types.h and
// cudaGetErrorString), and the emulation's own faults: what the GPU would
// stop the kernel for, or what it cannot emulate, thrown as exceptions.
#pragma once

#include <stdexcept>
#include <string>

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorDevicesUnavailable = 46,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidKernelImage = 200,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidPtx = 218,
  cudaErrorUnsupportedPtxVersion = 222,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchTimeout = 702,
  cudaErrorAssert = 710,
  cudaErrorHardwareStackError = 714,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorCooperativeLaunchTooLarge = 720,
  cudaErrorNotPermitted = 800,
  cudaErrorNotSupported = 801,
  cudaErrorInvalidClusterSize = 912,
};
using cudaError_t = cudaError;

inline const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorDevicesUnavailable:
      return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidKernelImage:
      return "device kernel image is invalid";
    case cudaErrorNoKernelImageForDevice:
      return "no kernel image is available for execution on the device";
    case cudaErrorInvalidPtx:
      return "a PTX JIT compilation failed";
    case cudaErrorUnsupportedPtxVersion:
      return "the provided PTX was compiled with an unsupported toolchain.";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchTimeout:
      return "the launch timed out and was terminated";
    case cudaErrorAssert:
      return "device-side assert triggered";
    case cudaErrorHardwareStackError:
      return "hardware stack error";
    case cudaErrorIllegalInstruction:
      return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress:
      return "misaligned address";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorCooperativeLaunchTooLarge:
      return "too many blocks in cooperative launch";
    case cudaErrorNotPermitted:
      return "operation not permitted";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorInvalidClusterSize:
      return "a kernel launch error has occurred due to cluster misconfiguration";
  }
  return "unrecognized error code";
}

namespace lltm::cuda_host {

// What would stop the kernel on the GPU (a misaligned access, a barrier that
// can never complete), or what the emulation cannot run: a C++ exception,
// which leaves the launch and reaches Python as a RuntimeError.
[[noreturn]] inline void fault(const std::string& what) {
  throw std::runtime_error("lltm host emulation of CUDA: " + what);
}

}  // namespace lltm::cuda_host
