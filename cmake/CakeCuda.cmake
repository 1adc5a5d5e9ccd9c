# Locate nvcc for `nvcc -fatbin` custom commands. We never enable CMake's CUDA language: the host
# extension is plain C++ and only needs CUDA headers for driver types (cuda.h), not the runtime.
#
# Order: CMAKE_CUDA_COMPILER, then $CUDACXX, then the nvidia-cuda-nvcc wheel in the build
# environment (site-packages/nvidia/cu13/bin/nvcc), then nvcc on PATH.
function(cake_find_nvcc)
  set(nvcc "")
  if(CMAKE_CUDA_COMPILER)
    set(nvcc "${CMAKE_CUDA_COMPILER}")
  elseif(DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
    set(nvcc "$ENV{CUDACXX}")
  else()
    find_package(Python 3.10 COMPONENTS Interpreter)
    if(Python_EXECUTABLE)
      execute_process(
        COMMAND "${Python_EXECUTABLE}" -c
"import os, sys
for p in sys.path:
    c = os.path.join(p, 'nvidia', 'cu13', 'bin', 'nvcc')
    if os.path.isfile(c):
        print(c); break"
        OUTPUT_VARIABLE nvcc OUTPUT_STRIP_TRAILING_WHITESPACE)
    endif()
    if(NOT nvcc)
      find_program(nvcc_on_path nvcc)
      if(nvcc_on_path)
        set(nvcc "${nvcc_on_path}")
      endif()
    endif()
  endif()
  if(NOT nvcc OR NOT EXISTS "${nvcc}")
    message(FATAL_ERROR "cake-moe: no nvcc found. Install nvidia-cuda-nvcc (the build requirements do), "
                        "or set CUDACXX to an nvcc.")
  endif()
  get_filename_component(nvcc "${nvcc}" REALPATH)
  get_filename_component(bindir "${nvcc}" DIRECTORY)
  get_filename_component(root "${bindir}" DIRECTORY)
  set(inc "${root}/include")
  if(NOT EXISTS "${inc}/cuda.h")
    # system toolkits lay headers out under targets/<arch>/include
    file(GLOB inc_alt "${root}/targets/*/include")
    list(GET inc_alt 0 inc)
  endif()
  if(NOT EXISTS "${inc}/cuda.h")
    message(FATAL_ERROR "cake-moe: cuda.h not found next to ${nvcc}")
  endif()
  execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE ver OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REGEX MATCH "release [0-9.]+, V[0-9.]+" ver "${ver}")
  set(extra "")
  if(EXISTS "${root}/cccl")
    set(extra "${root}/cccl")
  endif()
  message(STATUS "cake-moe: nvcc ${nvcc} (${ver}), CUDA headers ${inc}")
  set(CAKE_NVCC "${nvcc}" PARENT_SCOPE)
  set(CAKE_NVCC_VERSION "${ver}" PARENT_SCOPE)
  set(CAKE_CUDA_INCLUDE_DIR "${inc}" PARENT_SCOPE)
  set(CAKE_CCCL_INCLUDE_DIR "${extra}" PARENT_SCOPE)
endfunction()
