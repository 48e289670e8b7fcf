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
//     call, so this bounds what fetching it can cost;
//   - code reached by jumps: one thread runs 32 pieces of 1 KB of code in a
//     random order (a jump table), first pass against second, with the
//     code's lines in L2 and with L2 flushed before: what a branchy kernel
//     pays per jump to code the SM has not cached;
//   - the copy of the LL receive half alone, without any signal or
//     bookkeeping: 256 landed records of a 7168-byte FP8 row each copied to
//     4 expert slots (the 128-token EP2 shape) by 132 blocks of 256
//     threads, loads of a block's share in flight before its stores; also
//     only its loads and only its stores: the memory system's floor for the
//     receive half.
// Build: nvcc -O2 -arch=sm_90 tests/gpu/ll_probe.cu -o build/tests/ll_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>

#include "gpu/cuda_check.h"

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


// One piece of jumpy code: 64 dependent multiply-adds (1 KB of SASS).
#define LLP_PIECE(k)                                                      \
  case k:                                                                 \
    _Pragma("unroll") for (int i = 0; i < 64; i++)                        \
        asm volatile("mad.lo.u32 %0, %0, %1, %0;" : "+r"(x) : "r"(y + k)); \
    break;
#define LLP_PIECES8(b)                                                                                \
  LLP_PIECE(b) LLP_PIECE(b + 1) LLP_PIECE(b + 2) LLP_PIECE(b + 3) LLP_PIECE(b + 4) LLP_PIECE(b + 5) \
  LLP_PIECE(b + 6) LLP_PIECE(b + 7)

// One thread runs the 32 pieces in the order `order` (a jump table), twice;
// out[0] / out[1]: cycles of pass 1 / pass 2.
__global__ void jumpKernel(const int* order, uint32_t y, uint64_t* out) {
  uint32_t x = y;
  long long t[3];
#pragma unroll 1
  for (int pass = 0; pass < 2; pass++) {
    t[pass] = clock64();
#pragma unroll 1
    for (int j = 0; j < 32; j++) {
      switch (order[j]) { LLP_PIECES8(0) LLP_PIECES8(8) LLP_PIECES8(16) LLP_PIECES8(24) }
    }
  }
  t[2] = clock64();
  out[0] = uint64_t(t[1] - t[0]);
  out[1] = uint64_t(t[2] - t[1]);
  out[2] = x;
}

// jumpKernel with the SM's instruction caches cold (another kernel's code
// ran in between); `flush`: L2 flushed too (256 MiB written) before it.
void jumpProbe(uint64_t* out, bool flush) {
  std::vector<int> order(32);
  for (int i = 0; i < 32; i++) order[i] = (i * 13 + 7) % 32;  // a fixed scattered order
  int* d_order;
  CK(cudaMalloc(&d_order, 32 * sizeof(int)));
  CK(cudaMemcpy(d_order, order.data(), 32 * sizeof(int), cudaMemcpyHostToDevice));
  void* big = nullptr;
  if (flush) CK(cudaMalloc(&big, size_t(256) << 20));
  uint64_t h[3] = {0, 0, 0};
  for (int rep = 0; rep < 3; rep++) {  // the last repetition counts
    codeKernel<4096, 3><<<1, 1>>>(7, out + 3);  // 64 KB of other code through the instruction caches
    if (flush) CK(cudaMemset(big, rep, size_t(256) << 20));
    jumpKernel<<<1, 1>>>(d_order, 3, out);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost));
  }
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double us = 1000.0 / khz;
  printf("ll_probe: 32 jumps to 1 KB pieces of code, %-11s first pass %6.2f us, second %6.2f us: %5.0f ns per jump\n",
         flush ? "L2 flushed:" : "L2 warm:", double(h[0]) * us, double(h[1]) * us,
         (double(h[0]) - double(h[1])) * us * 1000 / 32);
  if (big) CK(cudaFree(big));
  CK(cudaFree(d_order));
}

// The receive half's copy alone (see the top): block b takes records
// [2b, 2b + 2) of `recs` (kRecBytes each), loads its share, 8 x 16 bytes per
// thread in flight, and stores each piece to the record's 4 slots of `out`
// (slot[r][d]: row index). kWhat: 0 copy, 1 loads only, 2 stores only.
// times[b * 2] / [b * 2 + 1]: the block's start / end (globaltimer).
constexpr int kCopyRecs = 256, kCopyRow = 7168, kCopySlots = 4;
template <int kWhat>
__global__ void __launch_bounds__(256, 1)
    copyKernel(const int4* recs, int4* out, const int* slot, unsigned long long* times, int* sink) {
  const unsigned long long t0 = globalTimer();
  const int pieces = kCopyRow / 16;
  const int lo = kCopyRecs * blockIdx.x / gridDim.x, hi = kCopyRecs * (blockIdx.x + 1) / gridDim.x;
  const int total = (hi - lo) * pieces;
  int acc = 0;
  for (int base = 0; base < total; base += 256 * 8) {
    int4 raw[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
      const int unit = base + u * 256 + threadIdx.x;
      if (unit >= total) continue;
      const int i = lo + unit / pieces, j = unit % pieces;
      if (kWhat == 2) {
        raw[u] = make_int4(i, j, u, 0);
      } else {
        asm volatile("ld.relaxed.gpu.global.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(raw[u].x), "=r"(raw[u].y), "=r"(raw[u].z), "=r"(raw[u].w)
                     : "l"(recs + size_t(i) * pieces + j) : "memory");
      }
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
      const int unit = base + u * 256 + threadIdx.x;
      if (unit >= total) continue;
      const int i = lo + unit / pieces, j = unit % pieces;
      if (kWhat == 1)
        acc ^= raw[u].x ^ raw[u].w;
      else
        for (int d = 0; d < kCopySlots; d++) out[size_t(slot[i * kCopySlots + d]) * pieces + j] = raw[u];
    }
  }
  if (kWhat == 1 && acc == 0x7fffffff) *sink = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    times[blockIdx.x * 2] = t0;
    times[blockIdx.x * 2 + 1] = globalTimer();
  }
}

// One load per 2 MiB page of `pages` pages: evicts the SMs' and the shared
// address translations of other memory while moving next to no data.
__global__ void touchPagesKernel(const uint64_t* base, int pages, int* sink) {
  uint64_t acc = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pages; i += gridDim.x * blockDim.x)
    acc ^= base[size_t(i) * (size_t(2) << 20) / 8];
  if (acc == 0x123456789ull) *sink = 1;
}

// Median over 50 launches of (latest block end - earliest block start);
// `thrash` (not null): touchPagesKernel over it before every launch.
template <int kWhat>
void copyProbe(const char* what, const int4* recs, int4* out, const int* slot, unsigned long long* times, int* sink,
               const uint64_t* thrash = nullptr, int thrash_pages = 0) {
  const int G = 132;
  std::vector<double> us;
  std::vector<unsigned long long> h(2 * G);
  for (int rep = 0; rep < 60; rep++) {
    if (thrash) touchPagesKernel<<<132, 128>>>(thrash, thrash_pages, sink);
    copyKernel<kWhat><<<G, 256>>>(recs, out, slot, times, sink);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), times, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    unsigned long long first = ~0ull, last = 0;
    for (int b = 0; b < G; b++) {
      first = std::min(first, h[2 * b]);
      last = std::max(last, h[2 * b + 1]);
    }
    if (rep >= 10) us.push_back((last - first) / 1000.0);
  }
  std::sort(us.begin(), us.end());
  printf("ll_probe: receive-half copy floor, %-34s median %5.2f us (%d records x %d slots, 132 blocks)\n", what,
         us[us.size() / 2], kCopyRecs, kCopySlots);
}

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("SKIPPED ll_probe: no GPU\n");
    return 0;
  }
  const bool two = ndev >= 2;  // the chains over NVLink need a peer
  if (!two) printf("ll_probe: one GPU: the NVLink chains are SKIPPED\n");
  for (int d = 0; two && d < 2; d++) {
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

  if (two) {
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
  }

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
  jumpProbe(code_out, false);
  jumpProbe(code_out, true);
  CK(cudaFree(code_out));

  // The receive half's copy: records landed in GPU 0's memory, rows of 144
  // experts x 256 slots in the output (as the 128-token EP2 shape).
  {
    const int pieces = kCopyRow / 16, rows = 144 * 256;
    int4 *recs, *outr;
    int *slot, *sink;
    unsigned long long* times;
    CK(cudaMalloc(&recs, size_t(kCopyRecs) * kCopyRow));
    CK(cudaMalloc(&outr, size_t(rows) * kCopyRow));
    CK(cudaMalloc(&slot, kCopyRecs * kCopySlots * sizeof(int)));
    CK(cudaMalloc(&sink, sizeof(int)));
    CK(cudaMalloc(&times, 2 * 132 * sizeof(unsigned long long)));
    CK(cudaMemset(recs, 0x35, size_t(kCopyRecs) * kCopyRow));
    std::vector<int> hs(kCopyRecs * kCopySlots);
    srand(777);
    for (int r = 0; r < kCopyRecs; r++)
      for (int d = 0; d < kCopySlots; d++) hs[r * kCopySlots + d] = (rand() % 144) * 256 + r;  // distinct rows
    CK(cudaMemcpy(slot, hs.data(), hs.size() * sizeof(int), cudaMemcpyHostToDevice));
    (void)pieces;
    copyProbe<0>("copy (loads, then 4 stores each):", recs, outr, slot, times, sink);
    copyProbe<1>("loads only:", recs, outr, slot, times, sink);
    copyProbe<2>("stores only:", recs, outr, slot, times, sink);
    // The same after other memory's translations evicted them (32 GiB, one
    // load per 2 MiB page): the LL kernels run between other kernels that
    // touch other buffers.
    uint64_t* thrash = nullptr;
    const int thrash_pages = 16384;
    if (cudaMalloc(&thrash, size_t(thrash_pages) << 21) == cudaSuccess) {
      CK(cudaMemset(thrash, 0, size_t(thrash_pages) << 21));
      copyProbe<0>("copy, translations evicted before:", recs, outr, slot, times, sink, thrash, thrash_pages);
      copyProbe<1>("loads only, translations evicted:", recs, outr, slot, times, sink, thrash, thrash_pages);
      copyProbe<2>("stores only, translations evicted:", recs, outr, slot, times, sink, thrash, thrash_pages);
      CK(cudaFree(thrash));
    } else {
      (void)cudaGetLastError();
      printf("ll_probe: SKIPPED the evicted-translation copy: 32 GiB not free\n");
    }
    CK(cudaFree(recs));
    CK(cudaFree(outr));
    CK(cudaFree(slot));
    CK(cudaFree(sink));
    CK(cudaFree(times));
  }
  return 0;
}
