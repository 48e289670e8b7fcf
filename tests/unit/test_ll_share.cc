// llShare (src/cuda/ll_share.h), the split of the low-latency kernels' work
// over blocks: the shares of n items over `parts` blocks are contiguous, in
// block order, cover [0, n) exactly once, differ in size by at most one, and
// with n <= parts hold 0 or 1 item each (kernels that give each block at most
// one record or token rely on it). llSliceShare, the dispatch send's rows
// and the combine send's records per block: every unit of every item handled
// by exactly one block, each item's first slice by exactly one, slices
// aligned as asked, and no larger than one step where there are blocks enough.
#include <vector>

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

// The 32-bit form of llShare equals n * i / parts formed in 64 bits, for
// counts up to INT_MAX and up to 65536 parts.
void shares_equal_the_64_bit_formula(void**) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const unsigned parts_of[] = {1, 2, 3, 7, 64, 131, 132, 1000, 65535, 65536};
  for (unsigned parts : parts_of) {
    for (int k = 0; k < 20000; k++) {
      const int n = k < 100 ? k : int(next() % (k % 2 ? 2147483648ull : 100000ull));
      const unsigned i = unsigned(next() % parts);
      int lo = -1, hi = -1;
      ep::cuda::llShare(n, i, parts, lo, hi);
      assert_int_equal(lo, int(uint64_t(n) * i / parts));
      assert_int_equal(hi, int(uint64_t(n) * (i + 1) / parts));
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

void checkSliceShares(int step, int align) {
  const int pieces_of[] = {2, 16, 128, 256, 272, 513, 896, 912, 2048, 4096, 16384};
  for (int G = 1; G <= 132; G += (G < 8 ? 1 : 31)) {
    for (int n = 0; n <= 400; n += (n < 40 ? 1 : 119)) {
      for (int pieces : pieces_of) {
        std::vector<int> covered(size_t(n) * pieces, 0), firsts(size_t(n), 0);
        for (int b = 0; b < G; b++) {
          const ep::cuda::LLSliceShare r = ep::cuda::llSliceShare(n, pieces, b, G, step, align);
          assert_true(r.lo <= r.hi && r.hi <= n);
          if (r.hi == r.lo) continue;
          assert_true(r.width > 0 && r.plo >= 0 && r.plo + r.width <= pieces);
          if (r.width != pieces) {  // a slice: one item, aligned
            assert_int_equal(r.hi - r.lo, 1);
            assert_int_equal(r.plo % align, 0);
            if (pieces % align == 0) assert_int_equal(r.width % align, 0);
            // Blocks enough for one step per slice: no slice is larger (up to the alignment).
            if (G / n >= (pieces + step - 1) / step) assert_true(r.width <= step + align - 1);
          }
          for (int c = r.lo; c < r.hi; c++) {
            if (r.plo == 0) firsts[c]++;
            for (int j = r.plo; j < r.plo + r.width; j++) covered[size_t(c) * pieces + j]++;
          }
        }
        for (int c : covered) assert_int_equal(c, 1);
        for (int c : firsts) assert_int_equal(c, 1);
        // llSlicesOf says how many blocks hold a part of each item (the
        // dispatch receive's slices count their readers against it).
        const ep::cuda::LLSlices cut = ep::cuda::llSlicesOf(n, pieces, G, step, align);
        std::vector<int> holders(size_t(n), 0);
        for (int b = 0; b < G; b++) {
          const ep::cuda::LLSliceShare r = ep::cuda::llSliceShare(n, pieces, b, G, step, align);
          if (r.hi > r.lo && cut.S >= 2) {
            holders[size_t(r.lo)]++;
            assert_true(r.width <= cut.chunk);
          }
        }
        if (cut.S >= 2)
          for (int h : holders) assert_int_equal(h, cut.filled);
      }
    }
  }
}

// The dispatch send's rows (one 16-byte piece per thread, whole FP8 scale
// blocks) and the combine send's records (kUnits steps of the block).
void dispatch_row_slices_store_every_piece_once(void**) { checkSliceShares(256, 16); }
void combine_record_slices_sum_every_unit_once(void**) { checkSliceShares(512, 1); }
// The dispatch receive's records (32-piece steps, whole 8-piece scale blocks).
void dispatch_receive_slices_copy_every_piece_once(void**) { checkSliceShares(32, 8); }

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shares_cover_every_item_once),
      cmocka_unit_test(shares_equal_the_64_bit_formula),
      cmocka_unit_test(large_counts_do_not_overflow),
      cmocka_unit_test(dispatch_row_slices_store_every_piece_once),
      cmocka_unit_test(combine_record_slices_sum_every_unit_once),
      cmocka_unit_test(dispatch_receive_slices_copy_every_piece_once),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
