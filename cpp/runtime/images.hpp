// Lazy, verified loading of embedded kernel images and a cache of kernel handles.
//
// An image is one (form, arch) fatbin. It is loaded the first time one of its kernels is asked
// for on a device of that arch: its SHA-256 is checked against the manifest first, then it goes
// to cuLibraryLoadData (context-independent: one load serves every device of that arch).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/embedded.hpp"

namespace cake_moe::runtime {

// Built arches, in manifest order.
std::vector<std::string> built_arches();

// The embedded image for (form, arch), or nullptr.
const EmbeddedImage* find_image(const std::string& form, const std::string& arch);

// Verifies `size` bytes against the manifest digest of (form, arch) and loads them; throws
// RuntimeError naming the form on a mismatch, before the driver sees a byte.
CUlibrary load_verified(const std::string& form, const std::string& arch, const void* data, std::size_t size);

// The kernel `name` of `form` for `device`'s arch (loads the image on first use, and the kernel
// into the device's context on its first lookup there, so no launch loads anything). Throws
// NotImplemented when the wheel has no image for that arch or form.
CUkernel get_kernel(const std::string& form, const char* name, int device);

// Number of images loaded so far (for tests of lazy loading).
std::size_t loaded_image_count();

}  // namespace cake_moe::runtime

namespace cake_moe::runtime {

// A kernel looked up once per device and then served without locking: host launchers keep one
// per kernel they launch.
class KernelRef {
 public:
  KernelRef(std::string form, std::string name) : form_(std::move(form)), name_(std::move(name)) {}
  CUkernel get(int device);
  const char* name() const { return name_.c_str(); }
  const std::string& form() const { return form_; }

 private:
  static constexpr int kMaxDevices = 64;
  std::string form_;
  std::string name_;
  CUkernel slots_[kMaxDevices] = {};
};

}  // namespace cake_moe::runtime
