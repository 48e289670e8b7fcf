// Helpers shared by the CMocka unit suites (tests/unit/test_*.cc).
//
// Each suite is its own process with one main and one cmocka group, linked
// against build/lib/libmoeep_internal.a so that internal C++ functions are
// callable. The helpers here print what was expected next to what was seen,
// so that a failure says more than the expression that failed.
#pragma once

// cmocka.h needs these before it, and (1.1.x) declares its functions without
// extern "C" guards.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "debug.h"
#include "moeep.h"
#include "params.h"

namespace eptest {

// Fails the test unless text contains needle.
inline void containsImpl(const char* text, const char* needle, const char* text_expr,
                         const char* file, int line) {
  if (text == nullptr) {
    print_error("%s:%d: %s is NULL, expected a string containing \"%s\"\n", file, line, text_expr,
                needle);
    _fail(file, line);
  }
  if (strstr(text, needle) == nullptr) {
    print_error("%s:%d: %s = \"%s\" does not contain \"%s\"\n", file, line, text_expr, text, needle);
    _fail(file, line);
  }
}

// Fails the test unless call returned `expected`; prints both codes and the
// thread's last error message.
inline void resultImpl(epResult_t got, epResult_t expected, const char* call, const char* file,
                       int line) {
  if (got != expected) {
    print_error("%s:%d: %s returned %d (%s), expected %d (%s); last error: \"%s\"\n", file, line,
                call, int(got), epGetErrorString(got), int(expected), epGetErrorString(expected),
                ep::threadLastError());
    _fail(file, line);
  }
}

// Deterministic random numbers for the randomised cases (seed printed on failure
// through the case's own assertions: every case uses a fixed seed).
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  int uniform(int lo, int hi) {  // [lo, hi]
    return std::uniform_int_distribution<int>(lo, hi)(gen);
  }
  float real(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  uint32_t bits32() { return uint32_t(gen()); }
};

// 64-byte aligned, zero-filled storage of `count` elements (with a spare cache
// line after them, so a stray write past the end is not a heap corruption).
template <typename T>
struct Buf {
  std::unique_ptr<T[], void (*)(void*)> mem{nullptr, free};
  size_t n = 0;
  Buf() = default;
  explicit Buf(size_t count) : n(count) {
    const size_t bytes = ((count * sizeof(T) + 63) / 64 + 1) * 64;
    mem.reset(static_cast<T*>(aligned_alloc(64, bytes)));
    memset(mem.get(), 0, bytes);
  }
  T* data() const { return mem.get(); }
  T& operator[](size_t i) const { return mem.get()[i]; }
};

// A host-backend config of the given shape, BF16 both ways, 20 s timeout.
inline epConfig_t hostConfig(int experts, int hidden, int max_tokens, int max_topk) {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = experts;
  c.hidden = hidden;
  c.max_tokens_per_rank = max_tokens;
  c.max_topk = max_topk;
  c.backend = epBackendHost;
  c.timeout_ms = 20000;
  return c;
}

// A communicator of one rank (a fresh unique id) with cfg.
inline epResult_t makeOneRankComm(epComm_t* comm, const epConfig_t& cfg) {
  epUniqueId id;
  epResult_t res = epGetUniqueId(&id);
  if (res != epSuccess) return res;
  return epCommInitRank(comm, 1, id, 0, &cfg);
}

// Unsets every EP_* variable the library knows, so that a suite runs with the
// defaults whatever the caller's environment holds. Call before the first use
// of any cached accessor.
inline void unsetAllParams() {
  for (int i = 0; i < ep::paramCount(); i++) {
    char name[128];
    snprintf(name, sizeof(name), "EP_%s", ep::paramInfo(i).name);
    unsetenv(name);
  }
}

}  // namespace eptest

#define assert_contains(text, needle) \
  ::eptest::containsImpl((text), (needle), #text, __FILE__, __LINE__)
#define assert_result(call, expected) \
  ::eptest::resultImpl((call), (expected), #call, __FILE__, __LINE__)
#define assert_ok(call) assert_result(call, epSuccess)
