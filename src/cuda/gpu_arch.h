// Which GPUs the library's kernels can run on, and the advice init gives when
// the GPU is not one of them. Host code only (no CUDA), shared by the CUDA
// backend and its unit test (tests/unit/test_gpu_arch.cc).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ep {
namespace cuda {

// The architectures the kernels were built for, as `make CUDA_ARCHS=...`
// gave them ("90", "80 90"). Set by the Makefile for the CUDA backend.
#ifndef EP_CUDA_ARCHS
#define EP_CUDA_ARCHS "90"
#endif

// "80 90" -> {80, 90}; anything that is not a number of two or three digits is
// skipped (the list comes from the build, not from a user at run time).
inline std::vector<int> parseArchs(const char* list) {
  std::vector<int> archs;
  const char* s = list;
  while (s != nullptr && *s != '\0') {
    char* end = nullptr;
    const long a = strtol(s, &end, 10);
    if (end == s) {
      s++;
      continue;
    }
    if (a >= 10 && a <= 999) archs.push_back(int(a));
    s = end;
  }
  return archs;
}

// Whether kernels built for sm_<arch> run on a GPU of compute capability
// major.minor. The build embeds machine code only (code=sm_XY, no PTX to
// compile at load), and that runs on the same major version at the same or a
// later minor one: sm_80 on 8.0, 8.6 and 8.9, not on 9.0; sm_90 on 9.0 only.
inline bool archRunsOn(int arch, int major, int minor) { return arch / 10 == major && arch % 10 <= minor; }

inline bool anyArchRunsOn(const std::vector<int>& archs, int major, int minor) {
  for (int a : archs)
    if (archRunsOn(a, major, minor)) return true;
  return false;
}

// "sm_80, sm_90"
inline std::string archNames(const std::vector<int>& archs) {
  std::string s;
  for (size_t i = 0; i < archs.size(); i++) s += (i ? ", sm_" : "sm_") + std::to_string(archs[i]);
  return s.empty() ? "no architecture" : s;
}

// The CUDA_ARCHS value that adds this GPU's architecture to the build's:
// "80 90" for an 8.6 GPU and a build of "90".
inline std::string archsWith(const std::vector<int>& archs, int major, int minor) {
  const int want = major * 10 + minor;
  std::vector<int> all = archs;
  bool added = false;
  for (size_t i = 0; i <= all.size() && !added; i++) {
    if (i == all.size() || all[i] > want) {
      all.insert(all.begin() + long(i), want);
      added = true;
    }
  }
  std::string s;
  for (size_t i = 0; i < all.size(); i++) s += (i ? " " : "") + std::to_string(all[i]);
  return s;
}

// The message of a GPU the kernels cannot run on: what was built, what the GPU
// is, and how to build for it.
inline std::string archRefusal(const std::vector<int>& archs, int device, const char* gpu_name, int major,
                               int minor) {
  char buf[512];
  snprintf(buf, sizeof(buf),
           "libmoeep's CUDA kernels were built for %s; GPU %d (%s) is compute capability %d.%d (sm_%d%d), which "
           "they cannot run on: rebuild the library with `make CUDA_ARCHS=\"%s\"`",
           archNames(archs).c_str(), device, gpu_name, major, minor, major, minor,
           archsWith(archs, major, minor).c_str());
  return buf;
}

}  // namespace cuda
}  // namespace ep
