// The CUDA driver, reached without linking: dlopen("libcuda.so.1") + cuGetProcAddress, each
// entry point requested at the version that introduced it (never at the toolkit's version, so
// an older driver hands out the ABI we compiled against).
#pragma once
#include <cuda.h>

#include <string>

#include "runtime/device_info.hpp"

namespace cake_moe::runtime {

struct Driver {
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuDriverGetVersion) DriverGetVersion = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGetName) DeviceGetName = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&::cuCtxGetCurrent) CtxGetCurrent = nullptr;
  decltype(&::cuCtxPushCurrent) CtxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) CtxPopCurrent = nullptr;
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuLibraryLoadData) LibraryLoadData = nullptr;
  decltype(&::cuLibraryGetKernel) LibraryGetKernel = nullptr;
  decltype(&::cuKernelSetAttribute) KernelSetAttribute = nullptr;
  decltype(&::cuLaunchKernelEx) LaunchKernelEx = nullptr;
  decltype(&::cuTensorMapEncodeTiled) TensorMapEncodeTiled = nullptr;
  decltype(&::cuTensorMapReplaceAddress) TensorMapReplaceAddress = nullptr;
  decltype(&::cuStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cuStreamIsCapturing) StreamIsCapturing = nullptr;
  decltype(&::cuKernelGetFunction) KernelGetFunction = nullptr;
  decltype(&::cuOccupancyMaxActiveClusters) OccupancyMaxActiveClusters = nullptr;
  int version = 0;  // cuDriverGetVersion, e.g. 13000
};

// The process-wide driver table. Loads and cuInit()s on first call; throws CudaError when no
// driver is installed or it is too old for an entry point we need.
const Driver& driver();

// True when libcuda.so.1 can be loaded and initialised (no exception); for `cake-moe info`.
bool driver_available(std::string* why = nullptr);

// "CUDA_ERROR_X (text)" for a result code.
std::string error_text(CUresult r);

// Throws CudaError("<what>: CUDA_ERROR_X (text)") unless r == CUDA_SUCCESS.
void check(CUresult r, const char* what);
inline void check(CUresult r, const std::string& what) { check(r, what.c_str()); }

// Makes the device's primary context (the one PyTorch uses) current for the scope, restoring
// the previous context afterwards. Costs one cuCtxGetCurrent when it is already current.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  bool pushed_ = false;
};

const DeviceInfo& device_info(int device);  // the reference stays valid for the process

// The fields of device_info one at a time.
std::string device_arch(int device);
int device_sm_count(int device);
double device_dram_bytes_per_s(int device);
int device_smem_per_sm(int device);
std::string device_name(int device);
int device_count();

}  // namespace cake_moe::runtime
