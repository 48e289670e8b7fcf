// llShare (src/cuda/ll_share.h), the split of the low-latency kernels' work
// over blocks: the shares of n items over `parts` blocks are contiguous, in
// block order, cover [0, n) exactly once, differ in size by at most one, and
// with n <= parts hold 0 or 1 item each (kernels that give each block at most
// one record or token rely on it).
#include "common.h"

#include "cuda/ll_share.h"

namespace {

void shares_cover_every_item_once(void**) {
  for (int parts = 1; parts <= 160; parts++) {
    for (int n = 0; n <= 700; n += (n < 300 ? 1 : 37)) {
      int next = 0, smallest = n, largest = 0;
      for (int i = 0; i < parts; i++) {
        int lo = -1, hi = -1;
        ep::cuda::llShare(n, unsigned(i), unsigned(parts), lo, hi);
        assert_int_equal(lo, next);  // contiguous, in block order
        assert_true(hi >= lo);
        next = hi;
        smallest = hi - lo < smallest ? hi - lo : smallest;
        largest = hi - lo > largest ? hi - lo : largest;
        if (n <= parts) assert_true(hi - lo <= 1);
      }
      assert_int_equal(next, n);  // every item, once
      assert_true(largest - smallest <= 1);
    }
  }
}

void large_counts_do_not_overflow(void**) {
  // n * (i + 1) exceeds 32 bits: the product is formed in 64 bits.
  const int n = 2000000000;
  int lo = 0, hi = 0;
  ep::cuda::llShare(n, 131, 132, lo, hi);
  assert_int_equal(hi, n);
  assert_true(lo > 0 && lo < hi);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shares_cover_every_item_once),
      cmocka_unit_test(large_counts_do_not_overflow),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
