// A library whose kernels were built for another GPU architecture than this
// GPU's: communicator init must refuse at once with epNotSupported and a
// message that names what was built, this GPU, and the `make CUDA_ARCHS=...`
// that would run here (src/cuda/gpu_arch.h), not fail later with CUDA's
// "no kernel image" or hang.
//   gpu_arch_test --expect-refused   run against such a library (tests/gpu/run.sh
//                                     builds one for another architecture)
//   gpu_arch_test                    against a library built for this GPU: init works
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "moeep.h"

int main(int argc, char** argv) {
  const bool expect_refused = argc > 1 && strcmp(argv[1], "--expect-refused") == 0;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIPPED gpu_arch_test: no GPU visible\n");
    return 0;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    printf("FAIL gpu_arch_test: cudaGetDeviceProperties\n");
    return 1;
  }
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = 8;
  cfg.hidden = 256;
  cfg.max_tokens_per_rank = 16;
  cfg.max_topk = 2;
  cfg.backend = epBackendCuda;
  cfg.low_latency = 1;
  epComm_t comm = nullptr;
  const int device = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const epResult_t r = epCommInitAll(&comm, 1, &device, &cfg);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = epGetLastError(nullptr);
  if (r == epSuccess) epCommDestroy(comm);
  printf("gpu_arch_test: GPU 0 %s (%d.%d): init %s in %.2f s%s%s\n", prop.name, prop.major, prop.minor,
         epGetErrorString(r), secs, r == epSuccess ? "" : ": ", r == epSuccess ? "" : msg.c_str());
  if (!expect_refused) {
    if (r != epSuccess) {
      printf("FAIL gpu_arch_test: init was refused on a GPU the library was built for\n");
      return 1;
    }
    printf("gpu_arch_test: PASSED\n");
    return 0;
  }
  char sm[32], cc[32];
  snprintf(sm, sizeof(sm), "(sm_%d%d)", prop.major, prop.minor);
  snprintf(cc, sizeof(cc), "compute capability %d.%d", prop.major, prop.minor);
  const char* wanted[] = {"built for sm_", sm, cc, prop.name, "make CUDA_ARCHS=\""};
  int bad = 0;
  if (r != epNotSupported) {
    printf("FAIL gpu_arch_test: init returned %s, expected epNotSupported\n", epGetErrorString(r));
    bad++;
  }
  for (const char* w : wanted) {
    if (msg.find(w) == std::string::npos) {
      printf("FAIL gpu_arch_test: the message does not say \"%s\"\n", w);
      bad++;
    }
  }
  if (secs > 10.0) {  // the refusal comes before any wait on peers
    printf("FAIL gpu_arch_test: the refusal took %.1f s\n", secs);
    bad++;
  }
  printf("gpu_arch_test: %s\n", bad ? "FAILED" : "PASSED");
  return bad ? 1 : 0;
}
