// Lets plain structs and small index helpers be shared by host C++ (g++) and device code (nvcc).
#pragma once
#if defined(__CUDACC__)
#define CAKE_HD __host__ __device__ __forceinline__
#else
#define CAKE_HD inline
#endif
