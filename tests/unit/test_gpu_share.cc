// Ranks that share a GPU (src/cuda/gpu_share.h): which ranks drive the same
// GPU (same machine and PCI bus id, not the same device ordinal), and the one
// high-throughput channel count all ranks agree on: the least any rank asks
// for, and no more than the share of its GPU's SMs that each rank on it gets
// (their kernels wait for each other, so all their blocks must be resident);
// and a rank's low-latency blocks, its share unless EP_CUDA_LL_SMS asks fewer.
#include <cstdio>
#include <vector>

#include "common.h"

#include "cuda/gpu_share.h"

namespace {

using ep::cuda::agreedChannels;
using ep::cuda::llBlocks;
using ep::cuda::ranksOnGpuOf;
using ep::cuda::sameGpu;

// Rank r on GPU gpu[r] of host host[r].
std::vector<epPeerInfo_v1_t> peersOn(const std::vector<int>& gpu, const std::vector<int>& host) {
  std::vector<epPeerInfo_v1_t> p(gpu.size());
  for (size_t r = 0; r < gpu.size(); r++) {
    p[r] = epPeerInfo_v1_t{};
    p[r].rank = int(r);
    p[r].host_hash = 1000 + uint64_t(host[r]);
    p[r].cuda_device = gpu[r];
    snprintf(p[r].bus_id, sizeof(p[r].bus_id), "0000:%02x:00.0", 0x18 + gpu[r]);
  }
  return p;
}

void one_gpu_per_rank_keeps_what_they_ask(void**) {
  const auto p = peersOn({0, 1, 2, 3}, {0, 0, 0, 0});
  for (int r = 0; r < 4; r++) assert_int_equal(ranksOnGpuOf(p, r), 1);
  assert_int_equal(agreedChannels(p, {32, 32, 32, 32}, {132, 132, 132, 132}), 32);
  assert_int_equal(agreedChannels(p, {64, 64, 64, 64}, {132, 132, 132, 132}), 64);
}

void every_rank_takes_the_least_any_asks(void**) {
  const auto p = peersOn({0, 1}, {0, 0});
  assert_int_equal(agreedChannels(p, {24, 32}, {132, 132}), 24);
  assert_int_equal(agreedChannels(p, {64, 16}, {132, 132}), 16);
  // A GPU with fewer SMs bounds everyone.
  assert_int_equal(agreedChannels(p, {64, 64}, {132, 40}), 40);
}

void ranks_on_one_gpu_split_its_sms(void**) {
  const auto p = peersOn({0, 1, 0, 1}, {0, 0, 0, 0});  // 4 ranks on 2 GPUs
  for (int r = 0; r < 4; r++) assert_int_equal(ranksOnGpuOf(p, r), 2);
  assert_true(sameGpu(p[0], p[2]));
  assert_false(sameGpu(p[0], p[1]));
  assert_int_equal(agreedChannels(p, {32, 32, 32, 32}, {132, 132, 132, 132}), 32);  // 2 x 32 fit
  assert_int_equal(agreedChannels(p, {64, 64, 64, 64}, {132, 132, 132, 132}), 64);
  assert_int_equal(agreedChannels(p, {100, 100, 100, 100}, {132, 132, 132, 132}), 66);
  // 8 ranks on 2 GPUs: 33 SMs each.
  const auto q = peersOn({0, 1, 0, 1, 0, 1, 0, 1}, std::vector<int>(8, 0));
  assert_int_equal(ranksOnGpuOf(q, 5), 4);
  assert_int_equal(agreedChannels(q, std::vector<int>(8, 64), std::vector<int>(8, 132)), 33);
}

void an_uneven_split_binds_every_rank(void**) {
  // Three ranks on GPU 0, one alone on GPU 1: the lone rank uses the crowded
  // GPU's share too, so that all ranks run the same channels.
  const auto p = peersOn({0, 0, 0, 1}, {0, 0, 0, 0});
  assert_int_equal(ranksOnGpuOf(p, 0), 3);
  assert_int_equal(ranksOnGpuOf(p, 3), 1);
  assert_int_equal(agreedChannels(p, {64, 64, 64, 64}, {132, 132, 132, 132}), 44);
}

void the_same_bus_id_on_another_host_is_another_gpu(void**) {
  const auto p = peersOn({0, 0}, {0, 1});  // GPU 0 of two machines
  assert_false(sameGpu(p[0], p[1]));
  assert_int_equal(ranksOnGpuOf(p, 0), 1);
  assert_int_equal(agreedChannels(p, {32, 32}, {132, 132}), 32);
}

void low_latency_blocks_are_the_rank_share_unless_asked(void**) {
  bool ignored = true;
  assert_int_equal(llBlocks(132, 1, 0, &ignored), 132);  // one rank: every SM
  assert_false(ignored);
  assert_int_equal(llBlocks(132, 2, 0, &ignored), 66);
  assert_int_equal(llBlocks(132, 8, 0, &ignored), 16);
  assert_int_equal(llBlocks(132, 3, 0, &ignored), 44);
  assert_int_equal(llBlocks(132, 2, 32, &ignored), 32);  // EP_CUDA_LL_SMS within the share
  assert_false(ignored);
  assert_int_equal(llBlocks(132, 2, 66, &ignored), 66);
  assert_false(ignored);
  assert_int_equal(llBlocks(132, 2, 100, &ignored), 66);  // past the share: ignored
  assert_true(ignored);
  assert_int_equal(llBlocks(132, 1, -3, &ignored), 132);
  assert_true(ignored);
  assert_int_equal(llBlocks(4, 8, 0, &ignored), 1);  // more ranks than SMs: one block each
  assert_int_equal(llBlocks(4, 8, 2, &ignored), 1);
  assert_true(ignored);
}

void more_ranks_than_sms_still_get_one_channel(void**) {
  const auto p = peersOn({0, 0, 0, 0}, {0, 0, 0, 0});
  assert_int_equal(agreedChannels(p, {32, 32, 32, 32}, {2, 2, 2, 2}), 1);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_gpu_per_rank_keeps_what_they_ask),
      cmocka_unit_test(every_rank_takes_the_least_any_asks),
      cmocka_unit_test(ranks_on_one_gpu_split_its_sms),
      cmocka_unit_test(an_uneven_split_binds_every_rank),
      cmocka_unit_test(the_same_bus_id_on_another_host_is_another_gpu),
      cmocka_unit_test(low_latency_blocks_are_the_rank_share_unless_asked),
      cmocka_unit_test(more_ranks_than_sms_still_get_one_channel),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
