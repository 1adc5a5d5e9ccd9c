#include "runtime/launch.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "runtime/driver.hpp"

namespace cake_moe::runtime {
namespace {
// The cluster-dimension attribute of `cfg` (unset dims count as 1; x = 0 means one CTA).
CUlaunchAttribute cluster_attribute(const LaunchConfig& cfg) {
  CUlaunchAttribute a{};
  a.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  a.value.clusterDim.x = cfg.cluster[0] ? cfg.cluster[0] : 1;
  a.value.clusterDim.y = cfg.cluster[1] ? cfg.cluster[1] : 1;
  a.value.clusterDim.z = cfg.cluster[2] ? cfg.cluster[2] : 1;
  return a;
}

// Whether `stream` may be part of a CUDA graph capture: CAKE_MOE_SYNC_CHECK's synchronisation
// would invalidate the capture there (and report it as a kernel fault), so it skips those. A
// failed query counts as capturing (the legacy stream answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
// while another stream captures in global mode).
bool capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const Driver& d = driver();
  if (!d.StreamIsCapturing) return false;
  return d.StreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}
}  // namespace

void launch(CUkernel kernel, const LaunchConfig& cfg, const void* args, const char* what) {
  CUlaunchAttribute attrs[2];
  unsigned n = 0;
  if (cfg.cluster[0] != 0) attrs[n++] = cluster_attribute(cfg);
  if (cfg.pdl) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n].value.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  CUlaunchConfig lc{};
  lc.gridDimX = cfg.grid[0];
  lc.gridDimY = cfg.grid[1];
  lc.gridDimZ = cfg.grid[2];
  lc.blockDimX = cfg.block[0];
  lc.blockDimY = cfg.block[1];
  lc.blockDimZ = cfg.block[2];
  lc.sharedMemBytes = cfg.smem_bytes;
  lc.hStream = reinterpret_cast<CUstream>(cfg.stream);
  lc.attrs = n ? attrs : nullptr;
  lc.numAttrs = n;
  void* params[] = {const_cast<void*>(args)};
  static const bool sync_check = [] {
    const char* v = std::getenv("CAKE_MOE_SYNC_CHECK");
    return v && v[0] == '1';
  }();
  const bool sync = sync_check && driver().StreamSynchronize && !capturing(lc.hStream);
  // Synchronising before the launch too tells a fault of earlier work on the stream (not a cake
  // kernel: each of those was synchronised after its own launch) from one of this kernel.
  if (sync) {
    const CUresult s = driver().StreamSynchronize(lc.hStream);
    if (s != CUDA_SUCCESS)
      check(s, std::string("fault in work queued before ") + what + ", not in it (CAKE_MOE_SYNC_CHECK)");
  }
  // A CUkernel is accepted wherever a CUfunction is; it resolves in the current context. The
  // error text is built only on failure (no heap allocation on the launch path).
  const CUresult r = driver().LaunchKernelEx(&lc, reinterpret_cast<CUfunction>(kernel), params, nullptr);
  if (r != CUDA_SUCCESS) check(r, std::string("launch of ") + what);
  if (sync) {
    const CUresult s = driver().StreamSynchronize(lc.hStream);
    if (s != CUDA_SUCCESS) check(s, std::string("kernel fault in ") + what + " (CAKE_MOE_SYNC_CHECK)");
  }
}

void set_max_dynamic_smem(CUkernel kernel, int device, unsigned bytes) {
  // once per (kernel, device) and size: every prepare asks, the attribute stays set
  static std::mutex mu;
  static std::map<std::pair<CUkernel, int>, unsigned> set;
  std::lock_guard<std::mutex> lock(mu);
  auto it = set.find({kernel, device});
  if (it != set.end() && it->second == bytes) return;
  const Driver& d = driver();
  CUdevice dev;
  check(d.DeviceGet(&dev, device), "cuDeviceGet");
  const CUresult r = d.KernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(bytes), kernel, dev);
  if (r != CUDA_SUCCESS)
    check(r, "cuKernelSetAttribute(max dynamic smem = " + std::to_string(bytes) + " bytes) on cuda:" +
                 std::to_string(device));
  set[{kernel, device}] = bytes;
}

int max_active_clusters(CUkernel kernel, int device, const LaunchConfig& cfg) {
  static std::mutex mu;
  using Key = std::tuple<CUkernel, int, unsigned, unsigned, unsigned>;
  static std::map<Key, int> known;
  CUlaunchAttribute attr = cluster_attribute(cfg);
  const unsigned cluster = attr.value.clusterDim.x * attr.value.clusterDim.y * attr.value.clusterDim.z;
  const Key key{kernel, device, cfg.block[0] * cfg.block[1] * cfg.block[2], cfg.smem_bytes, cluster};
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  const Driver& d = driver();
  ScopedDevice scope(device);  // the kernel's function in this device's context
  CUfunction fn = nullptr;
  check(d.KernelGetFunction(&fn, kernel), "cuKernelGetFunction");
  CUlaunchConfig lc{};
  lc.gridDimX = attr.value.clusterDim.x;  // the query wants a grid of whole clusters
  lc.gridDimY = attr.value.clusterDim.y;
  lc.gridDimZ = attr.value.clusterDim.z;
  lc.blockDimX = cfg.block[0];
  lc.blockDimY = cfg.block[1];
  lc.blockDimZ = cfg.block[2];
  lc.sharedMemBytes = cfg.smem_bytes;
  lc.attrs = &attr;
  lc.numAttrs = 1;
  int n = 0;
  check(d.OccupancyMaxActiveClusters(&n, fn, &lc), "cuOccupancyMaxActiveClusters");
  known[key] = n;
  return n;
}

}  // namespace cake_moe::runtime
