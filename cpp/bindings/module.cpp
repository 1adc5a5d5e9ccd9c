// The extension module cake_moe._ext: runtime queries plus one bind_* per kernel family.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/common.hpp"
#include "runtime/driver.hpp"
#include "runtime/images.hpp"
#include "runtime/sha256.hpp"

#ifndef CAKE_MOE_VERSION
#define CAKE_MOE_VERSION "0+unknown"
#endif

namespace nb = nanobind;
using namespace cake_moe;

NB_MODULE(_ext, m) {
  m.doc() = "cake-moe compiled runtime and kernel launchers";
  nb::exception<NotImplemented>(m, "NotImplementedError", PyExc_NotImplementedError);
  nb::exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
  m.attr("__version__") = CAKE_MOE_VERSION;

  m.def("manifest_json", [] { return std::string(runtime::kManifestJson); },
        "The build manifest (JSON): forms, arches, native/portable, SHA-256 per image.");
  m.def("images", [] {
    std::vector<std::tuple<std::string, std::string, std::string, size_t>> out;
    for (size_t i = 0; i < runtime::kNumEmbeddedImages; ++i) {
      const auto& img = runtime::kEmbeddedImages[i];
      out.emplace_back(img.form, img.arch, img.sha256, size_t(img.end - img.begin));
    }
    return out;
  }, "(form, arch, sha256, bytes) of every embedded image.");
  m.def("verify_image", [](const std::string& form, const std::string& arch) {
    const auto* img = runtime::find_image(form, arch);
    if (!img) throw NotImplemented("no image for " + form + " sm_" + arch);
    return runtime::sha256_hex(img->begin, size_t(img->end - img->begin)) == img->sha256;
  }, "Recompute an embedded image's SHA-256 and compare it with the manifest (no GPU needed).");
  m.def("image_bytes", [](const std::string& form, const std::string& arch) {
    const auto* img = runtime::find_image(form, arch);
    if (!img) throw NotImplemented("no image for " + form + " sm_" + arch);
    return nb::bytes(reinterpret_cast<const char*>(img->begin), size_t(img->end - img->begin));
  });
  m.def("load_image_bytes", [](const std::string& form, const std::string& arch, nb::bytes data) {
    runtime::load_verified(form, arch, data.c_str(), data.size());
  }, "Verify bytes against the manifest digest of (form, arch), then load them (testing hook).");
  m.def("sha256_hex", [](nb::bytes data) { return runtime::sha256_hex(data.c_str(), data.size()); });
  m.def("loaded_image_count", &runtime::loaded_image_count);
  m.def("driver_status", [] {
    std::string why;
    bool ok = runtime::driver_available(&why);
    return std::make_tuple(ok, ok ? runtime::driver().version : 0, why);
  }, "(available, driver version, reason when unavailable)");
  m.def("device_count", &runtime::device_count);
  m.def("device_arch", &runtime::device_arch);
  m.def("device_name", &runtime::device_name);
  m.def("device_sm_count", &runtime::device_sm_count);
  m.def("device_dram_bytes_per_s", &runtime::device_dram_bytes_per_s, "peak DRAM bandwidth (0: not reported)");
  m.def("device_narrow_memory", [](int device) { return runtime::device_info(device).narrow_memory(); },
        "less peak DRAM bandwidth per SM than narrow_memory_bytes_per_sm_s (the form choices read it)");
  m.attr("narrow_memory_bytes_per_sm_s") = runtime::kNarrowMemoryBytesPerSmS;

  bindings::bind_formats(m);
  bindings::bind_grouped_gemm(m);
  bindings::bind_mxfp4_moe(m);
}
