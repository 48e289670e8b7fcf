// Host allocations (operator new) of the whole process, counted and, on
// request, failed: for the tests of init's unwinding (gpu_host_test). The
// replacement lives in alloc_count.cc, compiled by the host compiler (nvcc
// takes operator new for device code too).
#pragma once

#include <atomic>

// Allocations left before one throws std::bad_alloc; -1: never.
extern std::atomic<long> g_fail_after;
// operator new blocks not yet deleted.
extern std::atomic<long> g_live;
