# lltm's CMake package, installed with the Python package (lltm/share/cmake/lltm/).
#
#   prefix: python -c "import lltm; print(lltm.cmake_prefix_path)"
#   cmake -DCMAKE_PREFIX_PATH="<torch's prefix>;<lltm's prefix>" ...
#   find_package(lltm REQUIRED)               # finds Torch too
#   target_link_libraries(app PRIVATE lltm::lltm)
#
# Imported targets:
#   lltm::lltm     lltm's operators, registered when the program starts: the
#                  CPU library, and the CUDA plugin's where it is installed for
#                  torch's CUDA version (as `import lltm` decides), linked so
#                  that no linker drops them (nothing references them by
#                  symbol); plus lltm::headers.
#   lltm::cpu      lltm/lib/lltm_cpu.so: the operators' schemas and CPU kernels.
#   lltm::cuda     lltm_cuda<major>/lib/lltm_cuda.so (the lltm-cuda<major>
#                  wheel): the CUDA kernels. Only where found.
#   lltm::headers  <lltm/lltm.h> (lltm::check_operators()) and torch, with the
#                  C++ standard torch's headers need, without loading anything.
# Components: `cuda` (find_package(lltm REQUIRED COMPONENTS cuda) fails,
# saying why, where the CUDA kernels cannot be used).
# Variables: lltm_VERSION, lltm_INCLUDE_DIRS, lltm_CPU_LIBRARY,
# lltm_CUDA_LIBRARY (empty where none), lltm_cuda_FOUND, lltm_CUDA_STATUS (one
# sentence: which CUDA kernels, or why none).
#
# Linux only: the libraries are what the wheels hold, built for Linux's
# dynamic linker (elsewhere Python loads them with dlopen/LoadLibrary).

if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
  set(lltm_FOUND FALSE)
  set(lltm_NOT_FOUND_MESSAGE
      "lltm's CMake package supports Linux only (this is ${CMAKE_SYSTEM_NAME}): load "
      "lltm's library (lltm/lib/lltm_cpu of the lltm wheel) with dlopen or LoadLibrary "
      "before loading a model")
  return()
endif()

# Torch first (its targets are what lltm's link to): find_dependency returns
# from this file, saying why, where it is not found.
include(CMakeFindDependencyMacro)
if(NOT TARGET torch)
  find_dependency(Torch)
endif()

cmake_policy(PUSH)
cmake_policy(VERSION 3.18...3.31)

# This file is <package>/share/cmake/lltm/lltmConfig.cmake; <package> is the
# Python package lltm, beside the other packages of its site-packages.
get_filename_component(_lltm_package "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
get_filename_component(_lltm_site "${_lltm_package}/.." ABSOLUTE)
# lltm_VERSION: find_package set it from lltmConfigVersion.cmake.
set(lltm_INCLUDE_DIRS "${_lltm_package}/include")
set(lltm_CPU_LIBRARY "${_lltm_package}/lib/lltm_cpu.so")
set(lltm_CUDA_LIBRARY "")
set(lltm_cuda_FOUND FALSE)

if(NOT EXISTS "${lltm_CPU_LIBRARY}")
  set(lltm_FOUND FALSE)
  set(lltm_NOT_FOUND_MESSAGE
      "${lltm_CPU_LIBRARY} does not exist: lltm at ${_lltm_package} has no compiled "
      "library (a source tree: build it with python setup.py build_ext --inplace, or "
      "pip install lltm)")
  cmake_policy(POP)
  return()
endif()

# Which CUDA plugin, as `import lltm` chooses it (lltm/_backends.py): the one
# for the CUDA major version torch was built with, none for a CPU-only torch.
set(_lltm_torch_cuda "")
if(DEFINED TORCH_INSTALL_PREFIX AND EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
  file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" _lltm_line REGEX "^cuda[: ]")
  if(_lltm_line MATCHES "'([0-9]+)\\.[0-9]+")
    set(_lltm_torch_cuda "${CMAKE_MATCH_1}")
  endif()
endif()
set(_lltm_plugin "lltm_cuda${_lltm_torch_cuda}")
if(_lltm_torch_cuda STREQUAL "")
  set(lltm_CUDA_STATUS "no CUDA kernels: torch is a CPU-only build (or its version.py was not found)")
elseif(NOT EXISTS "${_lltm_site}/${_lltm_plugin}/lib/lltm_cuda.so")
  set(lltm_CUDA_STATUS
      "no CUDA kernels: torch uses CUDA ${_lltm_torch_cuda} and ${_lltm_plugin} is not installed "
      "beside lltm (pip install 'lltm[cuda${_lltm_torch_cuda}]==${lltm_VERSION}')")
else()
  set(lltm_CUDA_LIBRARY "${_lltm_site}/${_lltm_plugin}/lib/lltm_cuda.so")
  set(lltm_cuda_FOUND TRUE)
  set(lltm_CUDA_STATUS "CUDA kernels: ${lltm_CUDA_LIBRARY}")
  # Built from another lltm: loaded all the same, as in Python, but said.
  file(GLOB _lltm_info "${_lltm_site}/lltm_cuda${_lltm_torch_cuda}-*.dist-info")
  if(_lltm_info AND NOT _lltm_info MATCHES "-${lltm_VERSION}\\.dist-info$")
    message(WARNING "lltm: ${_lltm_info} is not lltm ${lltm_VERSION}'s plugin: "
                    "pip install --force-reinstall --no-deps "
                    "'lltm-cuda${_lltm_torch_cuda}==${lltm_VERSION}'")
  endif()
endif()

# The C++ standard torch's headers need: torch's package names it (CXX_STANDARD
# of its target torch: 20 from torch 2.13 on; 2.14's headers refuse less) but
# does not pass it on; lltm::headers does. C++17 at least (<lltm/lltm.h>).
get_target_property(_lltm_std torch CXX_STANDARD)
if(NOT _lltm_std OR _lltm_std LESS 17)
  set(_lltm_std 17)
endif()

if(NOT TARGET lltm::headers)
  add_library(lltm::headers INTERFACE IMPORTED)
  set_target_properties(lltm::headers PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${lltm_INCLUDE_DIRS}"
    # For lltm::check_operators()'s message: the file to load.
    INTERFACE_COMPILE_DEFINITIONS "LLTM_CPU_LIBRARY=\"${lltm_CPU_LIBRARY}\""
    INTERFACE_COMPILE_FEATURES "cxx_std_${_lltm_std}"
    INTERFACE_LINK_LIBRARIES torch)

  # The libraries have a soname (lltm_cpu.so, lltm_cuda.so): a program needs
  # them by file name and finds them through its runpath (CMake's build tree
  # one, or what you install with it), not at the path they were linked from.
  # Nothing but the files: what they need comes with lltm::lltm, after them.
  add_library(lltm::cpu SHARED IMPORTED)
  set_target_properties(lltm::cpu PROPERTIES
    IMPORTED_LOCATION "${lltm_CPU_LIBRARY}"
    IMPORTED_SONAME "lltm_cpu.so")
  set(_lltm_libraries lltm::cpu)
  if(lltm_cuda_FOUND)
    add_library(lltm::cuda SHARED IMPORTED)
    set_target_properties(lltm::cuda PROPERTIES
      IMPORTED_LOCATION "${lltm_CUDA_LIBRARY}"
      IMPORTED_SONAME "lltm_cuda.so")
    list(APPEND _lltm_libraries lltm::cuda)
  endif()

  # Nothing calls into the libraries: their static initialisers register the
  # operators. --no-as-needed around them keeps the linker from dropping them
  # (the default of Debian's and Ubuntu's GCC), as torch's own CMake package
  # does for libtorch_cpu; --push-state/--pop-state leave the rest of the link
  # line as it was. Torch's libraries (lltm::headers) first, lltm's after
  # them: lltm's need torch's (the plugin, which has no runpath of its own,
  # needs libtorch_cuda and the CUDA runtime that one's runpath finds).
  add_library(lltm::lltm INTERFACE IMPORTED)
  set_target_properties(lltm::lltm PROPERTIES
    INTERFACE_LINK_LIBRARIES
      "lltm::headers;-Wl,--push-state,--no-as-needed;${_lltm_libraries};-Wl,--pop-state")
endif()

# find_package(lltm COMPONENTS cuda)
foreach(_lltm_component IN LISTS lltm_FIND_COMPONENTS)
  if(_lltm_component STREQUAL "cuda")
    if(NOT lltm_cuda_FOUND AND lltm_FIND_REQUIRED_cuda)
      set(lltm_FOUND FALSE)
      set(lltm_NOT_FOUND_MESSAGE "the component cuda was asked for: ${lltm_CUDA_STATUS}")
    endif()
  elseif(lltm_FIND_REQUIRED_${_lltm_component})
    set(lltm_FOUND FALSE)
    set(lltm_NOT_FOUND_MESSAGE "no component ${_lltm_component}; lltm has one: cuda")
  endif()
endforeach()

if(NOT DEFINED lltm_FOUND OR lltm_FOUND)
  if(NOT lltm_FIND_QUIETLY)
    message(STATUS "Found lltm ${lltm_VERSION}: ${lltm_CPU_LIBRARY}; ${lltm_CUDA_STATUS}")
  endif()
endif()

unset(_lltm_component)
unset(_lltm_info)
unset(_lltm_libraries)
unset(_lltm_line)
unset(_lltm_package)
unset(_lltm_plugin)
unset(_lltm_site)
unset(_lltm_std)
unset(_lltm_torch_cuda)
cmake_policy(POP)
