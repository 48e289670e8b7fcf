// Memory latencies behind the low-latency kernels' dependent steps, on this
// machine: one thread chases a chain of pointers (each load's address is the
// previous load's value), so every figure is one load's full round trip.
//   - %globaltimer resolution (the LL phase marks read it);
//   - L2-resident chains with each load kind the kernels use: weak, weak with
//     no L1 allocation (ldLanded), ld.relaxed.gpu (ldStaged), ld.acquire.gpu,
//     ld.acquire.sys (the signal waits);
//   - a chain the peer GPU wrote over NVLink just before (the landing zone);
//   - a chain in the peer GPU's memory (a load over NVLink);
//   - chains that touch a new 2 MiB page per step over 64 MiB and over 2 GiB
//     (address translation: the LL receive writes rows of up to 144 experts,
//     spread over the expert-major output of ~2 GiB);
//   - a chain in HBM (L2 flushed), the latency of a load that misses L2;
//   - instruction fetch: one thread runs 16 / 64 / 128 KB of straight-line
//     code twice in one launch (after a kernel with other code ran): the
//     first pass fetches it, the second runs it from the instruction caches
//     where it fits. The LL kernels run tens of KB of unrolled code once per
//     call, so this bounds what fetching it can cost.
// Build: nvcc -O2 -arch=sm_90 tests/gpu/ll_probe.cu -o build/tests/ll_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

enum LoadKind { kWeak, kWeakNoL1, kRelaxedGpu, kAcquireGpu, kAcquireSys, kKinds };
const char* const kKindNames[kKinds] = {"weak", "weak, L1::no_allocate", "ld.relaxed.gpu", "ld.acquire.gpu",
                                        "ld.acquire.sys"};

template <int kKind>
__device__ __forceinline__ uint64_t load(const uint64_t* p) {
  uint64_t v;
  if (kKind == kWeak) asm volatile("ld.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  if (kKind == kWeakNoL1) asm volatile("ld.global.L1::no_allocate.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  if (kKind == kRelaxedGpu) asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  if (kKind == kAcquireGpu) asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  if (kKind == kAcquireSys) asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Chases `steps` links from `start`; out[0] = ns, out[1] = cycles, out[2] = the end (keeps the chain live).
template <int kKind>
__global__ void chaseKernel(const uint64_t* start, int steps, uint64_t* out) {
  const uint64_t* p = start;
  const uint64_t t0 = globalTimer();
  const long long c0 = clock64();
  for (int i = 0; i < steps; i++) p = reinterpret_cast<const uint64_t*>(load<kKind>(p));
  const long long c1 = clock64();
  const uint64_t t1 = globalTimer();
  out[0] = t1 - t0;
  out[1] = uint64_t(c1 - c0);
  out[2] = reinterpret_cast<uint64_t>(p);
}

// The smallest nonzero step of %globaltimer seen in a busy loop, and how many
// distinct values 4096 reads saw.
__global__ void timerKernel(uint64_t* out) {
  uint64_t prev = globalTimer(), least = ~0ull, changes = 0;
  for (int i = 0; i < 4096; i++) {
    const uint64_t t = globalTimer();
    if (t != prev) {
      changes++;
      if (t - prev < least) least = t - prev;
      prev = t;
    }
  }
  out[0] = least;
  out[1] = changes;
}

// Writes a chain into `base` (possibly another GPU's memory): link i points
// to link order[i + 1], `stride` bytes apart in units of the chain.
__global__ void writeChainKernel(uint64_t* base, const uint32_t* order, int n, size_t stride_words) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint32_t from = order[i], to = order[(i + 1) % n];
    base[size_t(from) * stride_words] = reinterpret_cast<uint64_t>(base + size_t(to) * stride_words);
  }
}

struct Chain {
  uint64_t* base;
  int n;
  size_t stride_words;
};

// A random cyclic order of n links, written by GPU `writer` into `base`.
Chain makeChain(uint64_t* base, int n, size_t stride_bytes, int writer) {
  std::vector<uint32_t> order(n);
  for (int i = 0; i < n; i++) order[i] = uint32_t(i);
  srand(12345);
  for (int i = n - 1; i > 0; i--) std::swap(order[i], order[rand() % (i + 1)]);
  CK(cudaSetDevice(writer));
  uint32_t* d_order;
  CK(cudaMalloc(&d_order, n * sizeof(uint32_t)));
  CK(cudaMemcpy(d_order, order.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
  writeChainKernel<<<64, 256>>>(base, d_order, n, stride_bytes / 8);
  CK(cudaDeviceSynchronize());
  CK(cudaFree(d_order));
  return Chain{base, n, stride_bytes / 8};
}

enum Mode { kWarm, kFirst, kFlushed };

// Per-load latency of chasing `c` on GPU 0 with load kind K, 512 steps:
// kWarm the second of two runs (caches and translations warm), kFirst the
// first run, kFlushed a second run after 256 MiB of other writes (L2 flushed,
// translations warm).
template <int K>
void chase(const char* what, const Chain& c, Mode mode) {
  CK(cudaSetDevice(0));
  uint64_t* out;
  CK(cudaMalloc(&out, 3 * sizeof(uint64_t)));
  const int steps = 512;
  uint64_t h[3] = {0, 0, 0};
  for (int rep = 0; rep < (mode == kFirst ? 1 : 2); rep++) {
    if (rep == 1 && mode == kFlushed) {
      void* flush;
      CK(cudaMalloc(&flush, size_t(256) << 20));
      CK(cudaMemset(flush, rep, size_t(256) << 20));
      CK(cudaDeviceSynchronize());
      CK(cudaFree(flush));
    }
    chaseKernel<K><<<1, 1>>>(c.base, steps, out);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
  }
  printf("ll_probe: %-52s %-22s %6.0f ns per load (%5.0f cycles)\n", what, kKindNames[K], double(h[0]) / steps,
         double(h[1]) / steps);
  CK(cudaFree(out));
}

// kInsts dependent multiply-adds (one SASS instruction each, 16 bytes; the
// multiplier is only known at run time, so none fold), run twice by one
// thread; out[0] / out[1]: cycles of pass 1 / pass 2. kSalt makes another
// kernel (other code at other addresses) of the same size.
template <int kInsts, int kSalt>
__global__ void codeKernel(uint32_t y, uint64_t* out) {
  uint32_t x = y ^ (0x9e3779b9u * kSalt);
  long long t[3] = {0, 0, 0};
#pragma unroll 1
  for (int pass = 0; pass < 2; pass++) {
    const long long now = clock64();
    if (pass == 0) t[0] = now;
    else t[1] = now;
#pragma unroll
    for (int i = 0; i < kInsts; i++) asm volatile("mad.lo.u32 %0, %0, %1, %0;" : "+r"(x) : "r"(y));
  }
  t[2] = clock64();
  out[0] = uint64_t(t[1] - t[0]);
  out[1] = uint64_t(t[2] - t[1]);
  out[2] = x;
}

template <int kInsts>
void fetchProbe(uint64_t* out) {
  uint64_t h[3] = {0, 0, 0};
  for (int rep = 0; rep < 3; rep++) {  // the last repetition counts; the other kernel runs in between
    codeKernel<kInsts, 1><<<1, 1>>>(3, out);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
    codeKernel<kInsts, 2><<<1, 1>>>(5, out + 3);
    CK(cudaDeviceSynchronize());
  }
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double us = 1000.0 / khz;  // per cycle, at the nominal SM clock
  const double kb = kInsts * 16.0 / 1024;
  printf("ll_probe: straight-line code, %3.0f KB, one thread: first pass %6.2f us, second %6.2f us: "
         "%5.0f ns per KB fetched\n",
         kb, double(h[0]) * us, double(h[1]) * us, (double(h[0]) - double(h[1])) * us * 1000 / kb);
}

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
    printf("SKIPPED ll_probe: needs 2 GPUs\n");
    return 0;
  }
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
  }
  CK(cudaSetDevice(0));
  uint64_t* out;
  CK(cudaMalloc(&out, 2 * sizeof(uint64_t)));
  timerKernel<<<1, 1>>>(out);
  uint64_t tm[2];
  CK(cudaMemcpy(tm, out, sizeof(tm), cudaMemcpyDeviceToHost));
  printf("ll_probe: %%globaltimer: smallest step %llu ns, %llu changes in 4096 reads\n", (unsigned long long)tm[0],
         (unsigned long long)tm[1]);

  // 1 MiB chain on GPU 0 (L2-resident after the first run), 256-byte links.
  uint64_t* small0;
  CK(cudaMalloc(&small0, 1 << 20));
  const Chain l2 = makeChain(small0, 4096, 256, 0);
  chase<kWeak>("L2-resident chain, written by this GPU", l2, kWarm);
  chase<kWeakNoL1>("L2-resident chain, written by this GPU", l2, kWarm);
  chase<kRelaxedGpu>("L2-resident chain, written by this GPU", l2, kWarm);
  chase<kAcquireGpu>("L2-resident chain, written by this GPU", l2, kWarm);
  chase<kAcquireSys>("L2-resident chain, written by this GPU", l2, kWarm);

  // The same memory, chain written by GPU 1 over NVLink just before; first run only.
  const Chain landed = makeChain(small0, 4096, 256, 1);
  chase<kRelaxedGpu>("chain the peer just wrote over NVLink, first read", landed, kFirst);
  makeChain(small0, 4096, 256, 1);  // written by the peer again: the first read once more
  chase<kWeakNoL1>("chain the peer just wrote over NVLink, first read", landed, kFirst);

  // A chain in GPU 1's memory, read by GPU 0 over NVLink.
  CK(cudaSetDevice(1));
  uint64_t* small1;
  CK(cudaMalloc(&small1, 1 << 20));
  const Chain remote = makeChain(small1, 4096, 256, 1);
  chase<kRelaxedGpu>("chain in the peer's memory (a load over NVLink)", remote, kWarm);

  // A new 2 MiB page per step: 32 pages (64 MiB), then 1024 pages (2 GiB).
  CK(cudaSetDevice(0));
  uint64_t* big;
  const size_t page = size_t(2) << 20;
  CK(cudaMalloc(&big, 1024 * page));
  const Chain pages32 = makeChain(big, 32, page, 0);
  chase<kWeak>("a new 2 MiB page per load, 32 pages (64 MiB)", pages32, kWarm);
  const Chain pages1024 = makeChain(big, 1024, page, 0);
  chase<kWeak>("a new 2 MiB page per load, 1024 pages (2 GiB)", pages1024, kWarm);
  const Chain hbm = makeChain(big, 4096, 16384, 0);
  chase<kWeak>("16 KiB apart in 64 MiB, L2 flushed (HBM)", hbm, kFlushed);
  chase<kRelaxedGpu>("16 KiB apart in 64 MiB, L2 flushed (HBM)", hbm, kFlushed);
  CK(cudaFree(big));

  uint64_t* code_out;
  CK(cudaMalloc(&code_out, 6 * sizeof(uint64_t)));
  fetchProbe<1024>(code_out);
  fetchProbe<4096>(code_out);
  fetchProbe<8192>(code_out);
  CK(cudaFree(code_out));
  return 0;
}
