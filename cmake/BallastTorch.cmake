# LibTorch comes from the PyPI wheel `torch` (see scripts/python-requirements.txt).
# Only kernels/ and worker/train/ link it; ballastd and ballast must not.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import torch; print(torch.utils.cmake_prefix_path); print(torch.__version__.split('+')[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "The torch wheel does not import with ${Python3_EXECUTABLE}; run `make setup`.\n${_torch_err}")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 BALLAST_TORCH_PREFIX)
list(GET _torch_info 1 BALLAST_TORCH_VERSION)
list(GET _torch_info 2 _torch_cxx11_abi)

# The Debian libraries we link (gRPC, protobuf, yaml-cpp, spdlog...) use the
# C++11 std::string ABI. A wheel built with the old ABI would link but corrupt
# every std::string crossing the boundary, so refuse it here.
if(NOT _torch_cxx11_abi EQUAL 1)
  message(FATAL_ERROR "torch ${BALLAST_TORCH_VERSION} was built with _GLIBCXX_USE_CXX11_ABI=0; "
                      "Debian's libraries use the C++11 ABI. Install a cxx11-abi build of torch.")
endif()

# The CUDA wheel's TorchConfig looks for the CUDA toolkit; point it at the
# system one, which matches the wheel's CUDA 13.0.
if(EXISTS /usr/local/cuda/bin/nvcc AND NOT CUDAToolkit_ROOT)
  set(CUDAToolkit_ROOT /usr/local/cuda)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# TorchConfig of the CUDA wheel configures only with a CUDA toolkit (nvcc,
# its headers and cudart), even for a build that compiles no kernel; without
# one it ends in Caffe2's "cannot find the CUDA libraries". Say what is missing.
find_program(BALLAST_NVCC nvcc HINTS /usr/local/cuda/bin)
if(NOT BALLAST_NVCC AND NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "No CUDA toolkit: the torch wheel's CMake package needs NVIDIA's CUDA 13.0 "
                      "toolkit in /usr/local/cuda (or nvcc on PATH) to configure, even for a CPU-only "
                      "build (no GPU is needed). See README.md, Requirements.")
endif()
# Name the architectures so TorchConfig does not try to run a GPU probe,
# which fails (or guesses) on machines without a device.
set(TORCH_CUDA_ARCH_LIST "8.0;9.0;10.0")
list(APPEND CMAKE_PREFIX_PATH ${BALLAST_TORCH_PREFIX})
find_package(Torch REQUIRED)
message(STATUS "LibTorch ${BALLAST_TORCH_VERSION} from ${BALLAST_TORCH_PREFIX}")

# TorchConfig puts its flags in TORCH_CXX_FLAGS and a plain library list in
# TORCH_LIBRARIES; wrap both in one target so that only what links
# ballast::torch sees them.
add_library(ballast_torch INTERFACE)
add_library(ballast::torch ALIAS ballast_torch)
target_link_libraries(ballast_torch INTERFACE ${TORCH_LIBRARIES})
target_include_directories(ballast_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(ballast_torch INTERFACE ${_torch_flags})
target_compile_definitions(ballast_torch INTERFACE BALLAST_TORCH_VERSION="${BALLAST_TORCH_VERSION}")

# One precompiled header for every translation unit that includes torch.
# Targets reuse it with `target_precompile_headers(x REUSE_FROM ballast_torch_pch)`.
add_library(ballast_torch_pch OBJECT ${CMAKE_SOURCE_DIR}/cmake/torch_pch.cc)
target_link_libraries(ballast_torch_pch PUBLIC ballast::torch)
target_precompile_headers(ballast_torch_pch PRIVATE <torch/torch.h>)
