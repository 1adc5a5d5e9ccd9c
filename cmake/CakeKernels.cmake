# Kernel forms -> one generated .cu per form -> `nvcc -fatbin` per (form, arch), SASS only (no
# PTX: an older driver loads newer SASS but cannot JIT newer PTX) -> embedded with a manifest.
function(cake_build_kernels out_var)
  set(src "${CMAKE_CURRENT_SOURCE_DIR}")
  set(gen "${CMAKE_CURRENT_BINARY_DIR}/gen")
  string(REPLACE "," ";" archs "${CAKE_MOE_CUDA_ARCHS}")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${src}/tools/gen_kernels.py" --out "${gen}" --archs "${archs}"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cake-moe: kernel generation failed")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
    "${src}/cpp/kernels/forms.py" "${src}/tools/gen_kernels.py")
  include("${gen}/forms.cmake")
  file(GLOB_RECURSE device_headers CONFIGURE_DEPENDS "${src}/cpp/kernels/*.cuh" "${src}/cpp/kernels/*.hpp")

  set(nvcc_flags -std=c++17 -O3 -ccbin "${CMAKE_CXX_COMPILER}" -I "${src}/cpp/kernels" -I "${src}/cpp"
                 --expt-relaxed-constexpr -Xptxas=-warn-spills -Wno-deprecated-gpu-targets)
  # extra nvcc flags from the environment, e.g. CAKE_MOE_NVCC_FLAGS=-lineinfo for sanitizer runs
  if(DEFINED ENV{CAKE_MOE_NVCC_FLAGS})
    separate_arguments(extra_flags UNIX_COMMAND "$ENV{CAKE_MOE_NVCC_FLAGS}")
    list(APPEND nvcc_flags ${extra_flags})
  endif()
  if(CAKE_CCCL_INCLUDE_DIR)
    list(APPEND nvcc_flags -I "${CAKE_CCCL_INCLUDE_DIR}")
  endif()
  set(fatbins "")
  file(MAKE_DIRECTORY "${gen}/fatbin")
  foreach(entry IN LISTS CAKE_MOE_FORMS)
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 form)
    list(GET parts 1 form_archs)
    string(REPLACE "," ";" form_archs "${form_archs}")
    foreach(arch IN LISTS form_archs)
      set(fb "${gen}/fatbin/${form}.sm_${arch}.fatbin")
      add_custom_command(
        OUTPUT "${fb}"
        # nvcc_checked.py: fails the build on ptxas's silent performance losses (serialized wgmma)
        COMMAND "${Python_EXECUTABLE}" "${src}/tools/nvcc_checked.py" "${CAKE_NVCC}" ${nvcc_flags} -fatbin -gencode "arch=compute_${arch},code=sm_${arch}"
                -o "${fb}" "${gen}/${form}.cu"
        DEPENDS "${gen}/${form}.cu" ${device_headers} "${src}/tools/nvcc_checked.py"
        COMMENT "nvcc -fatbin ${form} sm_${arch}"
        VERBATIM)
      list(APPEND fatbins "${fb}")
    endforeach()
  endforeach()
  set(embedded "${gen}/embedded_images.cpp")
  add_custom_command(
    OUTPUT "${embedded}"
    COMMAND "${Python_EXECUTABLE}" "${src}/tools/embed_images.py" --gen "${gen}" --out "${embedded}"
            --version "${SKBUILD_PROJECT_VERSION}" --nvcc-version "${CAKE_NVCC_VERSION}"
    DEPENDS ${fatbins} "${gen}/forms.json" "${src}/tools/embed_images.py"
    COMMENT "embedding ${CMAKE_MATCH_COUNT} kernel images"
    VERBATIM)
  # .incbin reads the fatbins at assembly time: rebuild the embedding object when they change
  set_source_files_properties("${embedded}" PROPERTIES OBJECT_DEPENDS "${fatbins}" GENERATED TRUE)
  set(${out_var} "${embedded}" PARENT_SCOPE)
endfunction()
