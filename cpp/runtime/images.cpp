#include "runtime/images.hpp"

#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "runtime/driver.hpp"
#include "runtime/errors.hpp"
#include "runtime/sha256.hpp"

namespace cake_moe::runtime {
namespace {

std::mutex g_mu;
std::map<std::pair<std::string, std::string>, CUlibrary> g_libraries;   // (form, arch)
std::unordered_map<std::string, CUkernel> g_kernels;                      // "form/arch/name@device"
std::unordered_map<int, std::string> g_device_arch;

std::string arch_of(int device) {
  auto it = g_device_arch.find(device);
  if (it != g_device_arch.end()) return it->second;
  return g_device_arch[device] = device_arch(device);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ";") + x;
  return s;
}

// A kernel load's result: a failure inside stream capture (drivers before 12.3 cannot load
// modules there) says how to avoid it.
void check_load(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  const bool capture = r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  check(r, capture ? what + " (a kernel's first use inside CUDA graph capture, which drivers before 12.3 do not "
                            "allow: run the op once before capturing)"
                   : what);
}

CUlibrary load_locked(const std::string& form, const std::string& arch, const void* data, std::size_t size) {
  const EmbeddedImage* img = find_image(form, arch);
  if (!img) throw NotImplemented("no kernel image for form " + form + " on sm_" + arch);
  std::string got = sha256_hex(data, size);
  if (got != img->sha256)
    throw std::runtime_error("kernel image " + form + " (sm_" + arch + ") failed its SHA-256 check: manifest " +
                             img->sha256 + ", image " + got + "; the installed package is corrupted, reinstall it");
  const Driver& d = driver();
  CUlibrary lib = nullptr;
  check_load(d.LibraryLoadData(&lib, data, nullptr, nullptr, 0, nullptr, nullptr, 0),
             "cuLibraryLoadData(" + form + ", sm_" + arch + ")");
  return lib;
}

}  // namespace

std::vector<std::string> built_arches() {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < kNumEmbeddedImages; ++i) {
    std::string a = kEmbeddedImages[i].arch;
    bool seen = false;
    for (const auto& x : out) seen |= x == a;
    if (!seen) out.push_back(a);
  }
  return out;
}

const EmbeddedImage* find_image(const std::string& form, const std::string& arch) {
  for (std::size_t i = 0; i < kNumEmbeddedImages; ++i)
    if (form == kEmbeddedImages[i].form && arch == kEmbeddedImages[i].arch) return &kEmbeddedImages[i];
  return nullptr;
}

CUlibrary load_verified(const std::string& form, const std::string& arch, const void* data, std::size_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  return load_locked(form, arch, data, size);
}

CUkernel get_kernel(const std::string& form, const char* name, int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string arch = arch_of(device);
  std::string key = form + "/" + arch + "/" + name + "@" + std::to_string(device);
  auto it = g_kernels.find(key);
  if (it != g_kernels.end()) return it->second;
  auto built = built_arches();
  bool served = false;
  for (const auto& a : built) served |= a == arch;
  if (!served)
    throw NotImplemented("this cake-moe build has kernels for sm_" + join(built) + " but device " +
                         std::to_string(device) + " is sm_" + arch + " (form " + form +
                         "); rebuild with CAKE_MOE_CUDA_ARCHS including " + arch);
  CUlibrary& lib = g_libraries[{form, arch}];
  if (!lib) {
    const EmbeddedImage* img = find_image(form, arch);
    if (!img) throw NotImplemented("form " + form + " is not in this build (sm_" + arch + ")");
    lib = load_locked(form, arch, img->begin, std::size_t(img->end - img->begin));
  }
  CUkernel k = nullptr;
  check(driver().LibraryGetKernel(&k, lib, name), std::string("cuLibraryGetKernel(") + name + ")");
  // Load the kernel into the device's context now, not at its first launch: under lazy loading
  // (the default) that launch may be the one a CUDA graph captures, and a plan needs no warm-up run.
  {
    ScopedDevice scope(device);
    CUfunction fn = nullptr;
    check_load(driver().KernelGetFunction(&fn, k), std::string("cuKernelGetFunction(") + name + ")");
  }
  g_kernels.emplace(key, k);
  return k;
}

std::size_t loaded_image_count() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::size_t n = 0;
  for (const auto& kv : g_libraries) n += kv.second != nullptr;
  return n;
}

}  // namespace cake_moe::runtime

namespace cake_moe::runtime {

CUkernel KernelRef::get(int device) {
  if (device < 0 || device >= kMaxDevices) return get_kernel(form_, name_.c_str(), device);
  // Benign race: two threads may both look the kernel up; they store the same handle.
  CUkernel k = __atomic_load_n(&slots_[device], __ATOMIC_ACQUIRE);
  if (k) return k;
  k = get_kernel(form_, name_.c_str(), device);
  __atomic_store_n(&slots_[device], k, __ATOMIC_RELEASE);
  return k;
}

}  // namespace cake_moe::runtime
