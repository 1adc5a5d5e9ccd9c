// Where the block scheduler puts a grid's CTAs: launch N CTAs of a given shared-memory size and
// thread count (all resident at once), record each CTA's SM, and report how many distinct SMs
// the first `first` CTAs land on (a rule that assumes "CTAs 0..SMs-1 take one SM each" holds
// only if that number is the SM count).
//   nvcc -O2 -arch=sm_90a -o /tmp/smid ci/smid_placement.cu && /tmp/smid [smem_kb threads ctas first]
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

__global__ void record_sm(int* sm, long long spin_ns) {
  extern __shared__ unsigned char smem[];
  smem[threadIdx.x] = 0;  // keep the allocation
  if (threadIdx.x == 0) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = int(id);
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (long long t = t0; t - t0 < spin_ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  }
}

int main(int argc, char** argv) {
  const int smem_kb = argc > 1 ? atoi(argv[1]) : 102, threads = argc > 2 ? atoi(argv[2]) : 256;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int ctas = argc > 3 ? atoi(argv[3]) : 2 * sms, first = argc > 4 ? atoi(argv[4]) : sms;
  const int bytes = smem_kb * 1024;
  cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, record_sm, threads, bytes);
  int* d;
  cudaMalloc(&d, ctas * sizeof(int));
  std::vector<int> h(ctas);
  for (int rep = 0; rep < 5; ++rep) {
    record_sm<<<ctas, threads, bytes>>>(d, 20000);
    cudaMemcpy(h.data(), d, ctas * sizeof(int), cudaMemcpyDeviceToHost);
    std::map<int, int> first_count, all_count;
    for (int i = 0; i < ctas; ++i) {
      all_count[h[i]]++;
      if (i < first) first_count[h[i]]++;
    }
    int doubled = 0;
    for (auto& kv : first_count) doubled += kv.second > 1;
    printf("rep %d: %d SMs, %d CTAs/SM resident, %d CTAs on %d SMs; CTAs 0..%d on %d distinct SMs (%d SMs hold two or more of them)\n",
           rep, sms, per_sm, ctas, int(all_count.size()), first - 1, int(first_count.size()), doubled);
    if (rep == 0) {
      printf("  SM of CTA 0..31:");
      for (int i = 0; i < 32 && i < ctas; ++i) printf(" %d", h[i]);
      printf("\n");
    }
  }
  cudaFree(d);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
