#include "runtime/driver.hpp"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/errors.hpp"

namespace cake_moe::runtime {
namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct Loaded {
  Driver d;
  std::string error;  // empty when usable
};

template <typename Fn>
void resolve(GetProcAddress gpa, Fn& slot, const char* name, int version, std::string& error) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  CUresult r = gpa(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || p == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    if (error.empty())
      error = std::string("the CUDA driver has no entry point ") + name + " (version " +
              std::to_string(version) + "); update the NVIDIA driver";
    return;
  }
  slot = reinterpret_cast<Fn>(p);
}

Loaded load() {
  Loaded out;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    out.error = std::string("no CUDA driver: dlopen(libcuda.so.1) failed: ") + (e ? e : "?");
    return out;
  }
  auto gpa = reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!gpa) {
    out.error = "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2); update the NVIDIA driver";
    return out;
  }
  Driver& d = out.d;
  std::string& err = out.error;
  resolve(gpa, d.Init, "cuInit", 2000, err);
  resolve(gpa, d.DriverGetVersion, "cuDriverGetVersion", 2020, err);
  resolve(gpa, d.DeviceGet, "cuDeviceGet", 2000, err);
  resolve(gpa, d.DeviceGetCount, "cuDeviceGetCount", 2000, err);
  resolve(gpa, d.DeviceGetName, "cuDeviceGetName", 2000, err);
  resolve(gpa, d.DeviceGetAttribute, "cuDeviceGetAttribute", 2000, err);
  resolve(gpa, d.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, err);
  resolve(gpa, d.CtxGetCurrent, "cuCtxGetCurrent", 4000, err);
  resolve(gpa, d.CtxPushCurrent, "cuCtxPushCurrent", 4000, err);
  resolve(gpa, d.CtxPopCurrent, "cuCtxPopCurrent", 4000, err);
  resolve(gpa, d.GetErrorName, "cuGetErrorName", 6000, err);
  resolve(gpa, d.GetErrorString, "cuGetErrorString", 6000, err);
  resolve(gpa, d.LibraryLoadData, "cuLibraryLoadData", 12000, err);
  resolve(gpa, d.LibraryGetKernel, "cuLibraryGetKernel", 12000, err);
  resolve(gpa, d.KernelSetAttribute, "cuKernelSetAttribute", 12000, err);
  resolve(gpa, d.LaunchKernelEx, "cuLaunchKernelEx", 11060, err);
  resolve(gpa, d.TensorMapEncodeTiled, "cuTensorMapEncodeTiled", 12000, err);
  resolve(gpa, d.TensorMapReplaceAddress, "cuTensorMapReplaceAddress", 12000, err);
  std::string optional_error;  // only the CAKE_MOE_SYNC_CHECK debug mode needs these
  resolve(gpa, d.StreamSynchronize, "cuStreamSynchronize", 2000, optional_error);
  resolve(gpa, d.StreamIsCapturing, "cuStreamIsCapturing", 10000, optional_error);
  resolve(gpa, d.KernelGetFunction, "cuKernelGetFunction", 12000, err);
  resolve(gpa, d.OccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters", 11080, err);
  if (!err.empty()) return out;
  CUresult r = d.Init(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.GetErrorName(r, &name);
    out.error = std::string("cuInit failed: ") + (name ? name : "?") + " (no usable GPU?)";
    return out;
  }
  d.DriverGetVersion(&d.version);
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe one-time init
  return l;
}

}  // namespace

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw CudaError(l.error);
  return l.d;
}

bool driver_available(std::string* why) {
  const Loaded& l = loaded();
  if (why) *why = l.error;
  return l.error.empty();
}

std::string error_text(CUresult r) {
  const Driver& d = loaded().d;
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.GetErrorName) d.GetErrorName(r, &name);
  if (d.GetErrorString) d.GetErrorString(r, &text);
  std::string s = name ? name : ("CUresult " + std::to_string(int(r)));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw CudaError(std::string(what) + ": " + error_text(r));
}

namespace {
CUcontext primary_context(int device) {
  static std::mutex mu;
  static std::vector<CUcontext> ctx;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) throw ValueError("device index must be >= 0");
  if (ctx.size() <= size_t(device) || !ctx[device]) {
    const Driver& d = driver();
    CUdevice dev;
    check(d.DeviceGet(&dev, device), "cuDeviceGet");   // a valid index before the table grows to it
    CUcontext c;
    check(d.DevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
    if (ctx.size() <= size_t(device)) ctx.resize(size_t(device) + 1, nullptr);
    ctx[device] = c;
  }
  return ctx[device];
}
}  // namespace

ScopedDevice::ScopedDevice(int device) {
  const Driver& d = driver();
  CUcontext want = primary_context(device);
  CUcontext cur = nullptr;
  check(d.CtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (cur != want) {
    check(d.CtxPushCurrent(want), "cuCtxPushCurrent");
    pushed_ = true;
  }
}

ScopedDevice::~ScopedDevice() {
  if (pushed_) {
    CUcontext dummy;
    driver().CtxPopCurrent(&dummy);
  }
}

namespace {
CUresult query_attribute(int device, CUdevice_attribute a, int* v) {
  const Driver& d = driver();
  CUdevice dev;
  const CUresult r = d.DeviceGet(&dev, device);
  return r != CUDA_SUCCESS ? r : d.DeviceGetAttribute(v, a, dev);
}

int attribute(int device, CUdevice_attribute a, const char* what) {
  int v = 0;
  const CUresult r = query_attribute(device, a, &v);
  if (r != CUDA_SUCCESS) check(r, std::string(what) + " of cuda:" + std::to_string(device));
  return v;
}

// An attribute only a heuristic reads: 0 where the driver does not report it.
int attribute_or_zero(int device, CUdevice_attribute a) {
  int v = 0;
  return query_attribute(device, a, &v) == CUDA_SUCCESS ? v : 0;
}
}  // namespace

const DeviceInfo& device_info(int device) {
  static std::mutex mu;
  static std::map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceInfo info;
  const int major = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability");
  const int minor = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability");
  info.arch = std::to_string(major * 10 + minor) + "a";
  info.sm_count = attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count");
  const double clock_khz = attribute_or_zero(device, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
  const double bus_bits = attribute_or_zero(device, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  info.dram_bytes_per_s = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  return cache.emplace(device, std::move(info)).first->second;  // map nodes stay put
}

std::string device_arch(int device) { return device_info(device).arch; }

int device_sm_count(int device) { return device_info(device).sm_count; }

double device_dram_bytes_per_s(int device) { return device_info(device).dram_bytes_per_s; }

int device_smem_per_sm(int device) {
  return attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "shared memory per multiprocessor");
}

std::string device_name(int device) {
  const Driver& d = driver();
  CUdevice dev;
  check(d.DeviceGet(&dev, device), "cuDeviceGet");
  char name[256] = {};
  check(d.DeviceGetName(name, sizeof(name), dev), "cuDeviceGetName");
  return name;
}

int device_count() {
  int n = 0;
  check(driver().DeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

}  // namespace cake_moe::runtime
