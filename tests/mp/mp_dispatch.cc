// Multi-process dispatch / combine against the reference of mp_common.h on random shapes.
//
//   mp_dispatch -n RANKS [--cases C] [--seed S]     forks RANKS processes, C shapes
//   mpirun -n RANKS mp_dispatch --case I [--seed S]  one shape per launch under MPI
//   mp_dispatch -n RANKS --threads [--cases C]       ranks as threads (epCommInitAll)
//   mp_dispatch -n RANKS --soak ROUNDS [--warmup W] [--rss-slack-kb K] [--rdma-resource]
//       one communicator for ROUNDS rounds of dispatch, cached re-dispatch and
//       combine, each on new routing and data, each checked; after W warm-up
//       rounds (default 20) a rank's open descriptors, threads and (where the
//       ibverbs module is loaded) verbs objects must stay exactly the same to
//       the end, and its resident memory within K KiB (default 4096);
//       --rdma-resource: also what `rdma resource show` says of the
//       machine's RDMA objects (pd, cq, qp, mr), the same after the warm-up
//       and before the last round
//
// Every rank regenerates every rank's inputs (mp_common.h), so each checks
// every element it receives and every element combine returns to it.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "common/launch.h"
#include "common/launcher_env.h"
#include "mp_common.h"
#include "mp_usage.h"

using namespace mp;

namespace {

Shape makeShape(int nranks, uint64_t seed, int case_index) {
  Rng rng(seed * 31 + uint64_t(case_index));
  Shape s{};
  s.nranks = nranks;
  const epDataType_t types[] = {epBfloat16, epBfloat16, epFloat8E4M3, epFloat16, epFloat32};
  s.type = types[case_index % 5];
  // Hidden sizes whose row is a multiple of 16 bytes, mostly not powers of two.
  const int hiddens[] = {16, 24, 40, 128, 136, 520, 1000, 2560, 7168, 208};
  do {
    s.hidden = hiddens[rng.below(10)];
  } while ((size_t(s.hidden) * elemBytes(s.type)) % 16 != 0);
  s.topk = 1 + rng.below(9);  // 1..9
  if (case_index % 7 == 3) s.topk = 32;
  const int per_rank[] = {1, 2, 3, 8, 16, 64};
  int epr = per_rank[rng.below(6)];
  while (epr * nranks < s.topk) epr *= 2;
  s.experts = epr * nranks;
  const int big = s.hidden >= 2560 ? 64 : 300;
  for (int r = 0; r < nranks; r++) s.tokens[r] = rng.below(big + 1);
  if (case_index % 4 == 1) s.tokens[rng.below(nranks)] = 0;  // a rank with no tokens
  s.alignment = (case_index % 3 == 2) ? 1 + rng.below(16) : 0;
  s.minus_one = case_index % 2 == 0;
  s.seed = seed * 977 + uint64_t(case_index);
  return s;
}

int maxTokens(const Shape& s) {
  int m = 1;
  for (int r = 0; r < s.nranks; r++) m = std::max(m, s.tokens[r]);
  return m;
}

epConfig_t configOf(const Shape& s) {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = s.experts;
  cfg.hidden = s.hidden;
  cfg.max_tokens_per_rank = maxTokens(s);
  cfg.max_topk = s.topk;
  cfg.dispatch_type = s.type;
  cfg.combine_type = epBfloat16;
  cfg.backend = epBackendHost;
  cfg.timeout_ms = 60000;
  return cfg;
}

// Runs one shape on this rank of comm.
void checkCase(const Shape& s, int rank, epComm_t comm, bool exact, Tally* tally) {
  char label[160];
  snprintf(label, sizeof(label), "shape H=%d K=%d E=%d type=%d align=%d T=%d", s.hidden, s.topk,
           s.experts, int(s.type), s.alignment, s.tokens[rank]);
  std::vector<RankInput> all;
  for (int r = 0; r < s.nranks; r++) all.push_back(makeInput(s, r));
  const RankInput& mine = all[rank];
  const std::vector<RowSource> rows = expectedRows(s, all, rank);
  const int64_t nrecv = int64_t(rows.size());
  const size_t row_bytes = size_t(s.hidden) * elemBytes(s.type);
  const int nblocks = (s.hidden + 127) / 128;
  const int K = s.topk, L = s.experts / s.nranks;

  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = mine.x.data();
  a.x_type = s.type;
  a.x_scales = s.type == epFloat8E4M3 ? mine.scales.data() : nullptr;
  a.topk_idx = mine.topk.data();
  a.topk_idx_type = epInt64;
  a.topk_weights = mine.weights.data();
  a.num_tokens = mine.tokens;
  a.num_topk = K;
  a.expert_alignment = s.alignment;
  epHandle_t handle = nullptr;
  int64_t capacity = exact ? 0 : int64_t(s.nranks) * maxTokens(s);
  if (exact) {
    const epResult_t prepared = epDispatchPrepare(comm, &a, &handle, nullptr);
    tally->check(prepared == epSuccess, "prepare", rank);
    if (prepared != epSuccess) fprintf(stderr, "rank %d: prepare: %s\n", rank, epGetLastError(comm));
    int64_t n = -1;
    tally->check(handle && epHandleRecvCount(handle, &n) == epSuccess && n == nrecv, "exact count", rank);
    capacity = nrecv;
  } else {
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
  }
  // Poison outputs so unwritten elements show.
  std::vector<uint8_t> recv_x(size_t(capacity) * row_bytes + 16, 0xa5);
  std::vector<float> recv_scales(size_t(capacity) * nblocks + 1, -7.0f);
  std::vector<int64_t> recv_idx(size_t(capacity) * K + 1, 12345);
  std::vector<float> recv_w(size_t(capacity) * K + 1, -3.0f);
  std::vector<int> per_expert(L, -1);
  int64_t got_nrecv = -1;
  a.recv_x = recv_x.data();
  a.recv_scales = s.type == epFloat8E4M3 ? recv_scales.data() : nullptr;
  a.recv_topk_idx = recv_idx.data();
  a.recv_topk_weights = recv_w.data();
  a.recv_capacity = capacity;
  a.recv_tokens_per_expert = per_expert.data();
  a.num_recv = &got_nrecv;
  epResult_t res = epDispatch(comm, &a, &handle, nullptr);
  tally->check(res == epSuccess, "dispatch returns success", rank);
  if (res != epSuccess) fprintf(stderr, "rank %d: %s\n", rank, epGetLastError(comm));
  tally->check(got_nrecv == nrecv, "num_recv", rank);

  // Every received element against the reference.
  bool rows_ok = true, meta_ok = true;
  std::vector<int> want_per_expert(L, 0);
  for (int64_t i = 0; i < nrecv && rows_ok; i++) {
    const RowSource& src = rows[i];
    const RankInput& in = all[src.src];
    rows_ok &= memcmp(&recv_x[size_t(i) * row_bytes], &in.x[size_t(src.token) * row_bytes], row_bytes) == 0;
    if (s.type == epFloat8E4M3)
      rows_ok &= memcmp(&recv_scales[size_t(i) * nblocks], &in.scales[size_t(src.token) * nblocks],
                        size_t(nblocks) * 4) == 0;
    for (int k = 0; k < K; k++) {
      int64_t e = in.topk[size_t(src.token) * K + k];
      bool here = e >= 0 && ownerOf(s, e) == rank;
      int64_t want_idx = here ? e - int64_t(rank) * L : -1;
      float want_w = here ? in.weights[size_t(src.token) * K + k] : 0.0f;
      if (getenv("MP_DEBUG") && !(recv_idx[size_t(i) * K + k] == want_idx && recv_w[size_t(i) * K + k] == want_w))
        fprintf(stderr, "rank %d row %lld k %d: idx %lld want %lld, w %g want %g (src %d tok %d)\n", rank, (long long)i, k,
                (long long)recv_idx[size_t(i) * K + k], (long long)want_idx, recv_w[size_t(i) * K + k], want_w, src.src, src.token);
      meta_ok &= recv_idx[size_t(i) * K + k] == want_idx && recv_w[size_t(i) * K + k] == want_w;
      if (here) want_per_expert[want_idx]++;
    }
  }
  for (int64_t i = nrecv; i < capacity; i++)  // unused rows are marked
    for (int k = 0; k < K; k++) meta_ok &= recv_idx[size_t(i) * K + k] == -1;
  tally->check(rows_ok, label, rank);
  tally->check(meta_ok, "recv_topk_idx / weights", rank);
  bool counts_ok = true;
  for (int e = 0; e < L; e++) {
    int want = want_per_expert[e];
    if (s.alignment > 1) want = (want + s.alignment - 1) / s.alignment * s.alignment;
    counts_ok &= per_expert[e] == want;
  }
  tally->check(counts_ok, "recv_tokens_per_expert", rank);

  // Cached re-dispatch of other data with the same routing.
  std::vector<uint8_t> x2(mine.x.size());
  for (size_t i = 0; i < x2.size(); i++) x2[i] = uint8_t(mine.x[i] ^ 0x5a);
  if (s.type == epFloat16) for (size_t i = 1; i < x2.size(); i += 2) x2[i] &= 0xfb;  // stay finite
  std::vector<uint8_t> recv_x2(size_t(capacity) * row_bytes + 16, 0);
  epDispatchArgs_t c = a;
  c.x = x2.data();
  c.topk_idx = nullptr;
  c.topk_weights = nullptr;
  c.recv_x = recv_x2.data();
  c.recv_topk_idx = nullptr;
  c.recv_topk_weights = nullptr;
  c.recv_tokens_per_expert = nullptr;
  res = epDispatch(comm, &c, &handle, nullptr);
  tally->check(res == epSuccess, "cached dispatch", rank);
  if (res != epSuccess) fprintf(stderr, "rank %d: cached dispatch: %s\n", rank, epGetLastError(comm));
  bool cached_ok = true;
  for (int64_t i = 0; i < nrecv && cached_ok; i++) {
    const RowSource& src = rows[i];
    for (size_t b = 0; b < row_bytes; b++) {
      uint8_t want = uint8_t(all[src.src].x[size_t(src.token) * row_bytes + b] ^ 0x5a);
      if (s.type == epFloat16 && (b & 1)) want &= 0xfb;
      cached_ok &= recv_x2[size_t(i) * row_bytes + b] == want;
    }
  }
  tally->check(cached_ok, "cached dispatch rows", rank);

  // Combine: y row i = combineValue(rank, source, token), bias on the home rank.
  const int H = s.hidden;
  std::vector<uint16_t> y(size_t(std::max<int64_t>(nrecv, 1)) * H);
  for (int64_t i = 0; i < nrecv; i++)
    for (int j = 0; j < H; j++) y[size_t(i) * H + j] = toBf16(combineValue(s.seed, rank, rows[i].src, rows[i].token, j));
  std::vector<uint16_t> bias(size_t(std::max(mine.tokens, 1)) * H);
  for (int t = 0; t < mine.tokens; t++)
    for (int j = 0; j < H; j++) bias[size_t(t) * H + j] = toBf16(biasValue(s.seed, rank, t, j));
  std::vector<uint16_t> out(size_t(std::max(mine.tokens, 1)) * H, 0xffff);
  std::vector<float> out_w(size_t(std::max(mine.tokens, 1)) * K, -1.0f);
  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  ca.flags = EP_COMBINE_DETERMINISTIC;
  ca.y = y.data();
  ca.y_type = epBfloat16;
  ca.recv_topk_weights = recv_w.data();
  ca.num_topk = K;
  ca.bias = bias.data();
  ca.out = out.data();
  ca.out_topk_weights = out_w.data();
  res = epCombine(comm, &ca, handle, nullptr);
  tally->check(res == epSuccess, "combine returns success", rank);
  if (res != epSuccess) fprintf(stderr, "rank %d: combine: %s\n", rank, epGetLastError(comm));
  bool out_ok = true, w_ok = true;
  // The sum order (docs/SEMANTICS.md): node-major, ranks ascending inside a
  // node, then nodes ascending, then the bias.
  int num_nodes = 1;
  std::vector<int> node_of(size_t(s.nranks), 0);
  epCommNodes(comm, &num_nodes, node_of.data());
  for (int t = 0; t < mine.tokens; t++) {
    for (int j = 0; j < H && out_ok; j++) {
      float acc = 0.0f;
      for (int n = 0; n < num_nodes; n++) {
        float part = 0.0f;
        for (int r = 0; r < s.nranks; r++)
          if (node_of[size_t(r)] == n && goesTo(s, mine, t, r)) part += combineValue(s.seed, r, rank, t, j);
        acc += part;
      }
      acc += biasValue(s.seed, rank, t, j);
      out_ok &= out[size_t(t) * H + j] == toBf16(acc);
    }
    for (int k = 0; k < K; k++) {
      int64_t e = mine.topk[size_t(t) * K + k];
      float want = e >= 0 ? mine.weights[size_t(t) * K + k] : 0.0f;
      w_ok &= out_w[size_t(t) * K + k] == want;
    }
  }
  tally->check(out_ok, "combine output", rank);
  tally->check(w_ok, "combine weights summed back", rank);

  epHandleDestroy(handle);
}

// ---- soak --------------------------------------------------------------------

// Round r of a soak: the base shape with new token counts, data and routing.
Shape soakRound(const Shape& base, uint64_t seed, int r) {
  Shape s = base;
  Rng rng(seed * 7919 + uint64_t(r));
  for (int q = 0; q < s.nranks; q++) s.tokens[q] = rng.below(base.tokens[0] + 1);
  if (r % 5 == 4) s.tokens[rng.below(s.nranks)] = 0;
  s.alignment = r % 3 == 2 ? 1 + rng.below(8) : 0;
  s.minus_one = r % 2 == 0;
  s.seed = seed * 104729 + uint64_t(r);
  return s;
}

// --rdma-resource: what `rdma resource show` (iproute2) says of the
// machine's RDMA devices (pd, cq, qp, mr counts), "" where it cannot run.
std::string rdmaResources() {
  std::string out;
  if (FILE* p = popen("rdma resource show 2>/dev/null", "r")) {
    char buf[512];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  return out;
}

int runSoak(int nranks, uint64_t seed, int rounds, int warmup, long rss_slack_kb, bool rdma_resource) {
  epUniqueId id;
  LaunchInfo li;
  if (launchRanksWithIds(nranks, 3600, 1, &id, &li) != 0) return 1;
  Shape base{};
  base.nranks = li.nranks;
  base.hidden = 1000;
  base.topk = 6;
  base.experts = 8 * li.nranks;
  base.type = epBfloat16;
  for (int r = 0; r < li.nranks; r++) base.tokens[r] = 48;  // the most a round draws
  epConfig_t cfg = configOf(base);
  epComm_t comm = nullptr;
  if (epCommInitRank(&comm, li.nranks, id, li.rank, &cfg) != epSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", li.rank, epGetLastError(nullptr));
    return 1;
  }
  Tally tally;
  Usage after_warmup;
  // The machine's RDMA objects, taken at the start of a round (every rank is
  // inside the loop then: none has made or destroyed anything since the
  // previous round, nor will before the next).
  std::string res_after_warmup, res_end;
  for (int r = 0; r < rounds && tally.failed == 0; r++) {
    if (r == warmup) after_warmup = usageNow();
    if (rdma_resource && r == warmup) res_after_warmup = rdmaResources();
    if (rdma_resource && r == rounds - 1) res_end = rdmaResources();
    checkCase(soakRound(base, seed, r), li.rank, comm, r % 2 == 1, &tally);
  }
  if (rdma_resource && rounds > warmup) {
    printf("soak rank %d: rdma resource show after the warm-up:\n%ssoak rank %d: before the last round:\n%s", li.rank,
           res_after_warmup.c_str(), li.rank, res_end.c_str());
    tally.check(!res_end.empty() && res_end == res_after_warmup, "rdma resource show: the same objects", li.rank);
  }
  const Usage end = usageNow();
  bool ok = tally.failed == 0;
  if (rounds > warmup) {
    const bool same = end.fds == after_warmup.fds && end.threads == after_warmup.threads &&
                      end.verbs == after_warmup.verbs && end.rss_kb - after_warmup.rss_kb <= rss_slack_kb;
    printf("soak rank %d: %d rounds (%d warm-up): descriptors %d -> %d, threads %d -> %d, verbs objects %ld -> %ld, "
           "resident %ld -> %ld KiB (+%ld, slack %ld)%s\n", li.rank, rounds, warmup, after_warmup.fds, end.fds,
           after_warmup.threads, end.threads, after_warmup.verbs, end.verbs, after_warmup.rss_kb, end.rss_kb,
           end.rss_kb - after_warmup.rss_kb, rss_slack_kb, same ? "" : "  GREW");
    tally.check(same, "nothing grows after the warm-up", li.rank);
    ok = ok && same;
  }
  tally.check(epCommDestroy(comm) == epSuccess, "destroy", li.rank);
  const long verbs_left = verbsObjects();
  if (verbs_left >= 0) printf("soak rank %d: %ld verbs objects after destroy\n", li.rank, verbs_left);
  tally.check(verbs_left <= 0, "no verbs object left after destroy", li.rank);
  printf("mp_dispatch soak rank %d/%d: %d passed, %d failed\n", li.rank, li.nranks, tally.passed, tally.failed);
  return ok && tally.failed == 0 ? 0 : 1;
}

// One process per rank.
void runCase(const Shape& s, int rank, const epUniqueId& id, bool exact, Tally* tally) {
  epConfig_t cfg = configOf(s);
  epComm_t comm = nullptr;
  if (epCommInitRank(&comm, s.nranks, id, rank, &cfg) != epSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, epGetLastError(nullptr));
    tally->check(false, "init", rank);
    return;
  }
  checkCase(s, rank, comm, exact, tally);
  tally->check(epCommDestroy(comm) == epSuccess, "destroy", rank);
}

// All ranks as threads of this process (epCommInitAll); host calls block, so
// each rank runs in its own thread.
int runThreads(int nranks, uint64_t seed, int cases) {
  std::vector<Tally> tallies(nranks);
  for (int c = 0; c < cases; c++) {
    Shape s = makeShape(nranks, seed, c);
    epConfig_t cfg = configOf(s);
    std::vector<epComm_t> comms(nranks, nullptr);
    if (epCommInitAll(comms.data(), nranks, nullptr, &cfg) != epSuccess) {
      fprintf(stderr, "epCommInitAll failed: %s\n", epGetLastError(nullptr));
      return 1;
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; r++)
      threads.emplace_back([&, r] { checkCase(s, r, comms[r], c % 2 == 1, &tallies[r]); });
    for (auto& t : threads) t.join();
    for (int r = 0; r < nranks; r++) tallies[r].check(epCommDestroy(comms[r]) == epSuccess, "destroy", r);
  }
  int passed = 0, failed = 0;
  for (const Tally& t : tallies) {
    passed += t.passed;
    failed += t.failed;
  }
  printf("mp_dispatch %d threads: %d passed, %d failed\n", nranks, passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 2, cases = 12, only_case = -1, soak = 0, warmup = 20;
  long rss_slack_kb = 4096;
  bool threads = false, rdma_resource = false;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "-n" && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (arg == "--cases" && i + 1 < argc) cases = atoi(argv[++i]);
    else if (arg == "--case" && i + 1 < argc) only_case = atoi(argv[++i]);
    else if (arg == "--seed" && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (arg == "--threads") threads = true;
    else if (arg == "--soak" && i + 1 < argc) soak = atoi(argv[++i]);
    else if (arg == "--warmup" && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (arg == "--rss-slack-kb" && i + 1 < argc) rss_slack_kb = atol(argv[++i]);
    else if (arg == "--rdma-resource") rdma_resource = true;
    else {
      fprintf(stderr, "usage: %s [-n RANKS] [--threads] [--cases C | --case I | --soak ROUNDS [--warmup W] "
              "[--rss-slack-kb K] [--rdma-resource]] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  if (nranks < 1 || nranks > 16) {
    fprintf(stderr, "mp_dispatch: -n must be 1..16\n");
    return 2;
  }
  if (threads) return runThreads(nranks, seed, cases);
  if (soak > 0) return runSoak(nranks, seed, soak, warmup, rss_slack_kb, rdma_resource);
  // One unique id per shape: made before the fork, so every child has them all.
  const bool under_mpi = tools::launcherEnv().started;
  if (under_mpi && only_case < 0) only_case = 0;
  const int first = only_case >= 0 ? only_case : 0, count = only_case >= 0 ? 1 : cases;
  std::vector<epUniqueId> ids(count);
  LaunchInfo li;
  if (launchRanksWithIds(nranks, 600, under_mpi ? 1 : count, ids.data(), &li) != 0) return 1;
  Tally tally;
  for (int c = 0; c < count; c++) {
    Shape s = makeShape(li.nranks, seed, first + c);
    runCase(s, li.rank, ids[c], (first + c) % 2 == 1, &tally);
  }
  printf("mp_dispatch rank %d/%d: %d passed, %d failed\n", li.rank, li.nranks, tally.passed, tally.failed);
  return tally.failed == 0 ? 0 : 1;
}
