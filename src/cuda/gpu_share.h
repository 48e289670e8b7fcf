// Ranks that drive the same GPU, and the SM budget they agree on. Host code
// only (no CUDA), shared by the CUDA backend and its unit test
// (tests/unit/test_gpu_share.cc).
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "moeep_transport.h"  // epPeerInfo_v1_t

namespace ep {
namespace cuda {

// Whether two ranks drive the same GPU (same machine, same PCI bus id).
inline bool sameGpu(const epPeerInfo_v1_t& a, const epPeerInfo_v1_t& b) {
  return a.host_hash == b.host_hash && strncmp(a.bus_id, b.bus_id, sizeof(a.bus_id)) == 0;
}

// Ranks (r included) that drive rank r's GPU.
inline int ranksOnGpuOf(const std::vector<epPeerInfo_v1_t>& peers, int r) {
  int n = 0;
  for (const epPeerInfo_v1_t& p : peers) n += sameGpu(p, peers[r]) ? 1 : 0;
  return n;
}

// A rank's share of its GPU's SMs: gpu_sms split evenly among the `sharing`
// ranks on that GPU, whose kernels wait for each other and so must all be
// resident. At least 1.
inline int smShare(int gpu_sms, int sharing) { return std::max(gpu_sms / std::max(sharing, 1), 1); }

// The high-throughput channels (blocks) every rank uses, one count for all
// (a sender's channel c pairs with channel c of each receiver): the least that
// any rank asks for (wanted[r]) or that its share of its GPU's SMs (sms[r])
// allows. At least 1.
inline int agreedChannels(const std::vector<epPeerInfo_v1_t>& peers, const std::vector<int>& wanted,
                          const std::vector<int>& sms) {
  int c = 1 << 30;
  for (int r = 0; r < int(peers.size()); r++) c = std::min({c, wanted[r], smShare(sms[r], ranksOnGpuOf(peers, r))});
  return std::max(c, 1);
}

// The blocks of one rank's low-latency kernels, before the ranks agree on the
// least of them (LLEngine): its share of its GPU's SMs (smShare), or `want`
// (EP_CUDA_LL_SMS; 0: unset) where that is in 1..share. *ignored: a set want
// that was not in that range.
inline int llBlocks(int gpu_sms, int sharing, long long want, bool* ignored) {
  const int share = smShare(gpu_sms, sharing);
  *ignored = want != 0 && (want < 1 || want > share);
  return want >= 1 && want <= share ? int(want) : share;
}

}  // namespace cuda
}  // namespace ep
