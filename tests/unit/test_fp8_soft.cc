// The branch-free float -> E4M3 conversion of GPUs without the instruction
// (src/cuda/fp8_soft.h) against the host backend's floatToE4M3 (the reference
// the GPU tests compare with), for every one of the 2^32 floats (~6 s). On a
// GPU that has the instruction, tests/gpu/fp8_soft_test.cu compares the
// three.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common.h"

#include "cuda/fp8_soft.h"
#include "host/fp8.h"

namespace {

float fromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Mismatches over [lo, hi) with the given step.
uint64_t mismatches(uint64_t lo, uint64_t hi, uint64_t step) {
  uint64_t bad = 0;
  for (uint64_t u = lo; u < hi; u += step) {
    const float f = fromBits(uint32_t(u));
    const uint32_t soft = ep::fp8soft::toE4M3(f), ref = ep::floatToE4M3(f);
    if (soft != ref && bad++ < 5)
      printf("  0x%08x (%g): soft 0x%02x, host 0x%02x\n", unsigned(u), double(f), soft, ref);
  }
  return bad;
}

void every_float(void**) {
  assert_int_equal(mismatches(0, 1ull << 32, 1), 0);
}

void the_edges(void**) {
  const float cases[] = {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, 463.99997f, 480.0f, 1e30f,
                         1.0f / 0.0f, -1.0f / 0.0f, 0.015625f /* 2^-6 */, 0.001953125f /* 2^-9 */,
                         0.0009765625f /* 2^-10: a tie, to 0 */, 0.0029296875f /* 1.5 * 2^-9: a tie, to 2 */,
                         0.0146484375f /* 7.5 * 2^-9: a tie, to 8 = 2^-6 */, 1.0625f /* a tie, to 1 */,
                         1.1875f /* a tie, to 1.25 */, 0.0f * -1.0f};
  for (float f : cases) assert_int_equal(ep::fp8soft::toE4M3(f), ep::floatToE4M3(f));
  assert_int_equal(ep::fp8soft::toE4M3(448.0f), 0x7e);
  assert_int_equal(ep::fp8soft::toE4M3(-1e30f), 0xfe);
  assert_int_equal(ep::fp8soft::toE4M3(0.0146484375f), 0x08);
  assert_int_equal(ep::fp8soft::toE4M3(fromBits(0xffc00000u)), 0x7f);  // NaN: no sign
  assert_int_equal(ep::fp8soft::packE4M3x4(1.0f, -1.0f, 448.0f, 0.0f), 0x007eb838u);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_float),
      cmocka_unit_test(the_edges),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
