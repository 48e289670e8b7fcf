// Helpers shared by the GPU test and benchmark: random inputs, the host
// reference run, thread-per-rank execution.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "moeep.h"

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                                  \
    }                                                                                           \
  } while (0)
#define EK(comm, x)                                                                              \
  do {                                                                                           \
    epResult_t r_ = (x);                                                                         \
    if (r_ != epSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #x, epGetErrorString(r_),     \
              epGetLastError(comm));                                                             \
      exit(3);                                                                                   \
    }                                                                                            \
  } while (0)

inline size_t typeSize(epDataType_t t) {
  return t == epFloat32 ? 4 : t == epFloat8E4M3 ? 1 : 2;
}

inline void runRanks(int R, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < R; r++) th.emplace_back(fn, r);
  for (auto& t : th) t.join();
}

inline uint16_t toBf16Bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// Random finite values of type t (BF16 / FP16 / FP32) or random bytes (FP8).
inline void fillRandomRow(std::mt19937_64& g, epDataType_t t, void* dst, size_t n) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  if (t == epFloat8E4M3) {
    uint8_t* p = static_cast<uint8_t*>(dst);
    for (size_t i = 0; i < n; i++) {
      uint8_t v = uint8_t(g());
      if ((v & 0x7f) == 0x7f) v &= 0xfe;  // no NaN encodings
      p[i] = v;
    }
  } else if (t == epFloat32) {
    float* p = static_cast<float*>(dst);
    for (size_t i = 0; i < n; i++) p[i] = u(g);
  } else if (t == epBfloat16) {
    uint16_t* p = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; i++) p[i] = toBf16Bits(u(g));
  } else {  // fp16: random sign, exponent 10..20, mantissa
    uint16_t* p = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; i++)
      p[i] = uint16_t((g() & 0x8000u) | ((10 + g() % 10) << 10) | (g() & 0x3ffu));
  }
}

// K distinct experts of E per token; each entry -1 with probability neg.
inline void randomTopk(std::mt19937_64& g, int T, int K, int E, double neg, std::vector<int64_t>* out) {
  out->assign(size_t(T) * K, -1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int> perm(E);
  for (int t = 0; t < T; t++) {
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int k = 0; k < K && k < E; k++) {
      int j = k + int(g() % uint64_t(E - k));
      std::swap(perm[k], perm[j]);
      (*out)[size_t(t) * K + k] = u(g) < neg ? -1 : perm[k];
    }
  }
}
