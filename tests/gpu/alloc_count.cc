#include "alloc_count.h"

#include <execinfo.h>
#include <unistd.h>

#include <cstdlib>
#include <new>

std::atomic<long> g_fail_after{-1};
std::atomic<long> g_live{0};

void* operator new(size_t n) {
  long left = g_fail_after.load();
  while (left >= 0 && !g_fail_after.compare_exchange_weak(left, left - 1)) {
  }
  if (left == 0) {
    // EP_TEST_ALLOC_TRACE=1: where each injected failure happened, so that a
    // block an init's unwinding left behind can be traced to its path.
    static const bool trace = getenv("EP_TEST_ALLOC_TRACE") != nullptr;
    if (trace) {
      void* frames[24];
      backtrace_symbols_fd(frames, backtrace(frames, 24), STDERR_FILENO);
    }
    throw std::bad_alloc();
  }
  void* p = malloc(n ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  g_live++;
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
// The nothrow forms too (the library uses them).
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& nt) noexcept { return operator new(n, nt); }
static void release(void* p) {
  if (p == nullptr) return;
  g_live--;
  free(p);
}
void operator delete(void* p) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, size_t) noexcept { release(p); }
void operator delete[](void* p, size_t) noexcept { release(p); }
