// Low-latency dispatch / combine on the host backend against a reference
// written from docs/SEMANTICS.md, on random shapes, whole and split into send / receive halves.
//
//   mp_lowlat -n RANKS [--cases C] [--seed S] [--interleave-ht] [--shrink | --shrink-notice | --shrink-first-ll | --shrink-twice | --shrink-hang] [--rounds-after N]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/launch.h"
#include "mp_common.h"
#include "mp_usage.h"

using namespace mp;

namespace {

struct LLShape {
  int nranks, hidden, topk, experts, max_tokens;  // topk: config.max_topk
  int tokens[16];
  int topk_of[16];  // each rank's num_topk (every fourth case: not all equal)
  bool fp8, pow2, split;
  bool repeats;  // tokens that list an expert more than once
  uint64_t seed;
};

LLShape makeShape(int nranks, uint64_t seed, int c) {
  Rng rng(seed * 131 + uint64_t(c));
  LLShape s{};
  s.nranks = nranks;
  const int hiddens[] = {16, 48, 128, 144, 1040, 7168, 2064};
  s.hidden = hiddens[rng.below(7)];
  s.topk = 1 + rng.below(9);
  if (c % 5 == 4) s.topk = 32;
  int epr = 1 + rng.below(12);
  while (epr * nranks < s.topk) epr++;
  s.experts = epr * nranks;
  s.max_tokens = 1 + rng.below(s.hidden >= 2064 ? 24 : 130);
  for (int r = 0; r < nranks; r++) s.tokens[r] = rng.below(s.max_tokens + 1);
  for (int r = 0; r < nranks; r++) s.topk_of[r] = c % 4 == 3 ? std::max(1, s.topk - r % 3) : s.topk;
  if (c % 3 == 1) s.tokens[rng.below(nranks)] = 0;  // a rank that sends nothing
  s.fp8 = c % 2 == 0;
  s.pow2 = c % 4 == 2;
  s.split = c % 3 == 2;
  s.repeats = c % 5 == 1;
  s.seed = seed * 7 + uint64_t(c);
  return s;
}

struct Input {
  std::vector<uint16_t> x;
  std::vector<int64_t> topk;
  std::vector<float> w;
};

Input makeInput(const LLShape& s, int rank) {
  Rng rng(s.seed * 1000 + uint64_t(rank));
  Input in;
  const int T = s.tokens[rank], K = s.topk_of[rank];
  in.x.resize(size_t(T) * s.hidden);
  for (auto& v : in.x) v = toBf16((rng.uniform() * 2.0f - 1.0f) * (rng.below(4) == 0 ? 30.0f : 1.0f));
  in.topk.resize(size_t(T) * K);
  in.w.resize(size_t(T) * K);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      int64_t e;
      bool dup;
      do {
        e = rng.below(s.experts);
        dup = false;
        for (int j = 0; j < k; j++) dup |= in.topk[size_t(t) * K + j] == e;
      } while (dup);
      in.topk[size_t(t) * K + k] = (rng.below(12) == 0) ? -1 : e;
      in.w[size_t(t) * K + k] = rng.uniform();
    }
  if (s.repeats)  // every token's second entry repeats its first; every fourth token lists one expert K times
    for (int t = 0; t < T && K > 1; t++)
      for (int k = 1; k < (t % 4 == 0 ? K : 2); k++) in.topk[size_t(t) * K + k] = in.topk[size_t(t) * K];
  return in;
}

float e4m3ToFloat(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int exp = (v >> 3) & 0xf, mant = v & 7;
  if (exp == 0) return sign * std::ldexp(float(mant), -9);
  return sign * std::ldexp(1.0f + float(mant) / 8.0f, exp - 7);
}

float yValue(uint64_t seed, int rank, int expert, int src, int token, int j) {
  return combineValue(seed ^ (uint64_t(expert) << 24), rank, src, token, j);
}

// --interleave-ht: between the low-latency dispatch and its combine, a
// high-throughput dispatch of the same tokens and a combine of the rows as
// received (no weights): each output row is x times the number of ranks that
// received the token. Across nodes the two kinds of call travel on
// connections of different traffic classes through the same rings, so this
// is where a ring that changed class too early would show.
bool g_interleave_ht = false;

void interleavedHighThroughput(const LLShape& s, const std::vector<Input>& all, const Input& mine, int rank,
                               epComm_t comm, Tally* tally) {
  const int R = s.nranks, L = s.experts / R, H = s.hidden, K = s.topk_of[rank], T = s.tokens[rank];
  auto ranksOf = [&](int src, int t) {  // the ranks token t of src goes to
    std::vector<bool> to(size_t(R), false);
    const int Ks = s.topk_of[src];
    for (int k = 0; k < Ks; k++) {
      const int64_t e = all[size_t(src)].topk[size_t(t) * Ks + k];
      if (e >= 0) to[size_t(e / L)] = true;
    }
    return to;
  };
  int64_t want_recv = 0;
  for (int src = 0; src < R; src++)
    for (int t = 0; t < s.tokens[src]; t++) want_recv += ranksOf(src, t)[size_t(rank)];
  const int64_t cap = int64_t(R) * s.max_tokens;
  std::vector<uint16_t> recv(size_t(cap) * H + 1, 0xeeee);
  int64_t num_recv = -1;
  // Every rank passes the config's top-k columns (-1 beyond its own): high
  // throughput takes no rank with more columns than another.
  std::vector<int64_t> topk(size_t(T) * s.topk, -1);
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) topk[size_t(t) * s.topk + k] = mine.topk[size_t(t) * K + k];
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = mine.x.data();
  a.x_type = epBfloat16;
  a.topk_idx = topk.data();
  a.topk_idx_type = epInt64;
  a.num_tokens = T;
  a.num_topk = s.topk;
  a.recv_x = recv.data();
  a.recv_capacity = cap;
  a.num_recv = &num_recv;
  epHandle_t h = nullptr;
  const bool dispatched = epDispatch(comm, &a, &h, nullptr) == epSuccess;
  tally->check(dispatched, "high-throughput dispatch between low-latency calls", rank);
  if (!dispatched) {
    fprintf(stderr, "  rank %d: %s\n", rank, epGetLastError(comm));
    return;
  }
  tally->check(num_recv == want_recv, "its row count", rank);
  std::vector<uint16_t> out(size_t(std::max(T, 1)) * H, 0xffff);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv.data();
  c.out = out.data();
  tally->check(epCombine(comm, &c, h, nullptr) == epSuccess, "its combine", rank);
  bool ok = true;
  for (int t = 0; t < T && ok; t++) {
    const std::vector<bool> to = ranksOf(rank, t);
    const float n = float(std::count(to.begin(), to.end(), true));
    for (int j = 0; j < H && ok; j++) {
      // As values: a token that went nowhere is +0 (no -0 from 0 x a negative x).
      ok = fromBf16(out[size_t(t) * H + j]) == fromBf16(toBf16(n * fromBf16(mine.x[size_t(t) * H + j])));
      if (!ok)
        fprintf(stderr, "  rank %d token %d [%d]: %g, want %g x %g\n", rank, t, j, fromBf16(out[size_t(t) * H + j]), n,
                fromBf16(mine.x[size_t(t) * H + j]));
    }
  }
  tally->check(ok, "its combine output (x times the ranks that received it)", rank);
  epHandleDestroy(h);
}

// --shrink (the last case): after it ran once, rank 1 exits before the next
// dispatch; the others' dispatch fails naming it, they shrink (the dead set
// must be that rank alone), and the case runs again, checked against the
// same reference with that rank's tokens gone and its experts -1 in every
// token's top-k (docs/SEMANTICS.md, "Shrink"), the calls given the ids as
// they were.
bool g_shrink = false;
// --shrink-notice (the last case): nobody dies; rank 0 calls epCommShrink
// while the others are in a dispatch that waits for it. Its first message
// must end their dispatch well before the timeout (20 s) with an error saying
// a shrink began; they shrink too, nobody is found dead, and the next layer
// matches the full reference.
bool g_shrink_notice = false;
// --shrink-first-ll: as --shrink, but no low-latency call before the death:
// the dispatch that meets it is the communicator's first low-latency call,
// and the layer after the shrink the first to complete (across nodes its
// connections must exist without the bootstrap the death broke).
bool g_shrink_first_ll = false;
// --shrink-twice: as --shrink, then the last rank dies too; a second shrink
// must return both ranks (epoch 2) and the next layer match the reference
// without either.
bool g_shrink_twice = false;
// --shrink-hang: as --shrink, but rank 1 stops (SIGSTOP) instead of exiting:
// the others' call ends at their timeout, and the shrink finds it silent.
// It goes on (and exits) g_hang_seconds after it stopped.
bool g_shrink_hang = false;
int g_hang_seconds = 20;
// --rounds-after N (with --shrink): N checked layers after the shrink; from
// the fifth on, the survivors' descriptors, threads and verbs objects must
// stay the same and resident memory within 4 MiB, and no more descriptors
// be open than before the death (the dead rank's connections are closed).
int g_rounds_after = 0;

// One low-latency dispatch and combine (and, with --interleave-ht, a
// high-throughput layer between them) of this rank's input `real`, checked
// against the reference of the shape `s` and inputs `all` (this rank's ids
// there are what the library must use: masked after a shrink).
void checkLayer(const LLShape& s, const std::vector<Input>& all, const Input& real, int rank, epComm_t comm,
                Tally* tally) {
  const int R = s.nranks, L = s.experts / R, M = s.max_tokens, H = s.hidden, K = s.topk_of[rank];
  const size_t cap = size_t(R) * M;
  const int nblocks = (H + 127) / 128;
  const Input& mine = all[rank];
  const int T = s.tokens[rank];

  const size_t row_bytes = s.fp8 ? size_t(H) : size_t(H) * 2;
  std::vector<uint8_t> recv_x(size_t(L) * cap * row_bytes + 16, 0xee);
  std::vector<float> recv_scales(size_t(L) * nblocks * cap + 1, -1.0f);
  std::vector<int> recv_count(L, -1), recv_src(size_t(L) * cap + 1, -7);
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.flags = (s.pow2 ? EP_LL_ROUND_SCALE_POW2 : 0u) | (s.split ? EP_LL_SEND_ONLY : 0u);
  a.x = real.x.data();
  a.topk_idx = real.topk.data();
  a.topk_weights = real.w.data();
  a.num_tokens = T;
  a.num_topk = K;
  a.wire_type = s.fp8 ? epFloat8E4M3 : epBfloat16;
  a.recv_x = recv_x.data();
  a.recv_scales = recv_scales.data();
  a.recv_count = recv_count.data();
  a.recv_src = recv_src.data();
  epHandle_t h = nullptr;
  tally->check(epLowLatencyDispatch(comm, &a, &h, nullptr) == epSuccess, "ll dispatch", rank);
  if (s.split) tally->check(epLowLatencyComplete(comm, h, nullptr) == epSuccess, "ll dispatch receive half", rank);

  // Expected rows per local expert: sources ascending, tokens ascending, a token
  // once however often it lists the expert.
  bool layout_ok = true, values_ok = true;
  for (int e = 0; e < L && layout_ok; e++) {
    int slot = 0;
    for (int src = 0; src < R; src++)
      for (int t = 0; t < s.tokens[src]; t++) {
        bool selects = false;
        const int Ks = s.topk_of[src];
        for (int k = 0; k < Ks; k++) selects |= all[src].topk[size_t(t) * Ks + k] == int64_t(rank) * L + e;
        if (!selects) continue;
        if (recv_src[size_t(e) * cap + slot] != src * M + t) layout_ok = false;
        const uint16_t* x = &all[src].x[size_t(t) * H];
        const uint8_t* got = &recv_x[(size_t(e) * cap + slot) * row_bytes];
        for (int b = 0; b < nblocks && values_ok; b++) {
          float amax = 0.0f;
          for (int j = b * 128; j < std::min(H, b * 128 + 128); j++) amax = std::fmax(amax, std::fabs(fromBf16(x[j])));
          float scale = std::fmax(amax, 1e-4f) / 448.0f;
          if (s.pow2) scale = std::exp2(std::ceil(std::log2(scale)));
          if (s.fp8) values_ok &= recv_scales[(size_t(e) * nblocks + b) * cap + slot] == scale;
          for (int j = b * 128; j < std::min(H, b * 128 + 128); j++) {
            if (!s.fp8) {
              uint16_t v;
              memcpy(&v, got + 2 * j, 2);
              values_ok &= v == x[j];
            } else {  // within E4M3's rounding: 2^-4 relative, 2^-10 of the scale absolute
              float want = fromBf16(x[j]), back = e4m3ToFloat(got[j]) * scale;
              values_ok &= std::fabs(back - want) <= std::fmax(std::fabs(want) / 16.0f, scale / 1024.0f) * 1.001f;
            }
          }
        }
        slot++;
      }
    layout_ok &= recv_count[e] == slot;
  }
  tally->check(layout_ok, "ll expert-major layout, counts and sources", rank);
  tally->check(values_ok, "ll received values and scales", rank);

  if (g_interleave_ht) interleavedHighThroughput(s, all, real, rank, comm, tally);

  // Combine: y[e][slot] from (rank, expert, source, token); expected sum as docs/SEMANTICS.md states it.
  std::vector<uint16_t> y(size_t(L) * cap * H, 0);
  for (int e = 0; e < L; e++)
    for (int slot = 0; slot < recv_count[e]; slot++) {
      int src = recv_src[size_t(e) * cap + slot] / M, tok = recv_src[size_t(e) * cap + slot] % M;
      for (int j = 0; j < H; j++) y[(size_t(e) * cap + slot) * H + j] = toBf16(yValue(s.seed, rank, e, src, tok, j));
    }
  std::vector<uint16_t> out(size_t(std::max(T, 1)) * H, 0xffff);
  epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
  c.flags = s.split ? EP_LL_SEND_ONLY : 0u;
  c.y = y.data();
  c.out = out.data();
  tally->check(epLowLatencyCombine(comm, &c, h, nullptr) == epSuccess, "ll combine", rank);
  if (s.split) tally->check(epLowLatencyComplete(comm, h, nullptr) == epSuccess, "ll combine receive half", rank);
  bool out_ok = true;
  for (int t = 0; t < T && out_ok; t++)
    for (int j = 0; j < H; j++) {
      float acc = 0.0f;
      for (int r = 0; r < R; r++) {
        float partial = 0.0f;
        bool any = false;
        for (int k = 0; k < K; k++) {
          int64_t e = mine.topk[size_t(t) * K + k];
          if (e < 0 || e / L != r) continue;
          any = true;
          float yv = fromBf16(toBf16(yValue(s.seed, r, int(e % L), rank, t, j)));
          partial = std::fma(mine.w[size_t(t) * K + k], yv, partial);
        }
        if (any) acc += partial;
      }
      out_ok &= out[size_t(t) * H + j] == toBf16(acc);
    }
  tally->check(out_ok, "ll combine output", rank);
  c.flags = 0;
  tally->check(epLowLatencyCombine(comm, &c, h, nullptr) == epInvalidUsage, "a handle is combined once", rank);
  epHandleDestroy(h);
}

// How long a recovery takes: the dying rank writes the time of its death to
// MP_DEATH_FILE (ranks of one machine share the clock); each survivor prints
// when its call failed, how long epCommShrink took and the first layer after
// it, on a "RECOVERY" line (docs/BENCHMARKS.md has the figures).
double g_layer_before_ms = 0;  // the case's first layer (init's lazy connections included)

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void noteDeathTime() {
  const char* path = getenv("MP_DEATH_FILE");
  if (path == nullptr || *path == 0) return;
  if (FILE* f = fopen(path, "w")) {
    fprintf(f, "%.6f\n", wallSeconds());
    fclose(f);
  }
}

void reportRecovery(int rank, int gone, double call_began, double failed_at, double shrunk_at, double layer_began,
                    double layer_done) {
  double died = 0;
  const char* path = getenv("MP_DEATH_FILE");
  if (path != nullptr && *path != 0)
    if (FILE* f = fopen(path, "r")) {
      if (fscanf(f, "%lf", &died) != 1) died = 0;
      fclose(f);
    }
  char since_death[160] = "";
  if (died > 0)
    snprintf(since_death, sizeof since_death, "; after rank %d's death: call failed %.1f ms, ready %.1f ms", gone,
             (failed_at - died) * 1e3, (shrunk_at - died) * 1e3);
  printf("RECOVERY rank %d: failing call %.1f ms, epCommShrink %.1f ms, first layer after %.1f ms (the first "
         "before: %.1f ms)%s\n",
         rank, (failed_at - call_began) * 1e3, (shrunk_at - failed_at) * 1e3, (layer_done - layer_began) * 1e3,
         g_layer_before_ms, since_death);
  fflush(stdout);
}

// Receive buffers of a BF16 low-latency dispatch of shape `s`.
struct LLRecvBuffers {
  std::vector<uint8_t> rx;
  std::vector<float> sc;
  std::vector<int> cnt, src;
};

// The arguments of a BF16 low-latency dispatch of this rank's real input,
// receiving into `bufs` (sized here; they must outlive the call's handle).
epLowLatencyDispatchArgs_t realInputLLArgs(const LLShape& s, const std::vector<Input>& all, int rank,
                                           LLRecvBuffers* bufs) {
  const int R = s.nranks;
  const int L = s.experts / R, cap = R * s.max_tokens;
  bufs->rx.assign(size_t(L) * cap * size_t(s.hidden) * 2 + 16, 0);
  bufs->sc.assign(size_t(L) * cap * ((s.hidden + 127) / 128) + 1, 0.0f);
  bufs->cnt.assign(size_t(L), 0);
  bufs->src.assign(size_t(L) * cap + 1, 0);
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.x = all[rank].x.data();
  a.topk_idx = all[rank].topk.data();
  a.topk_weights = all[rank].w.data();
  a.num_tokens = s.tokens[rank];
  a.num_topk = s.topk_of[rank];
  a.wire_type = epBfloat16;
  a.recv_x = bufs->rx.data();
  a.recv_scales = bufs->sc.data();
  a.recv_count = bufs->cnt.data();
  a.recv_src = bufs->src.data();
  return a;
}

// A low-latency dispatch of this rank's real input that is expected to fail
// (a rank died, or a shrink began): its result and the error's words.
epResult_t failingDispatch(const LLShape& s, const std::vector<Input>& all, int rank, epComm_t comm,
                           std::string* why) {
  LLRecvBuffers bufs;
  const epLowLatencyDispatchArgs_t a = realInputLLArgs(s, all, rank, &bufs);
  epHandle_t h = nullptr;
  const epResult_t res = epLowLatencyDispatch(comm, &a, &h, nullptr);
  *why = epGetLastError(comm);
  if (h) epHandleDestroy(h);
  return res;
}

// The low-latency dispatch that meets the death of rank `gone` must fail,
// naming it (in its own words, or as the rank a shrink's notice counts dead
// or the call waits for).
void dispatchMeetsDeath(const LLShape& s, const std::vector<Input>& all, int rank, epComm_t comm, int gone,
                        Tally* tally) {
  std::string why;
  const epResult_t failed = failingDispatch(s, all, rank, comm, &why);
  tally->check(failed == epRemoteError || failed == epTimeout, "the dispatch that meets the death fails", rank);
  tally->check(why.find("rank " + std::to_string(gone)) != std::string::npos, "naming the dead rank", rank);
  if (why.find("rank " + std::to_string(gone)) == std::string::npos) fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
}

// --rounds-after: layers on the survivors, each checked, nothing growing.
void soakAfterShrink(const LLShape& s, const std::vector<Input>& all, int rank, epComm_t comm,
                     const Usage& before_death, Tally* tally) {
  constexpr int kWarmup = 5;
  constexpr long kRssSlackKb = 4096;
  Usage warm;
  const int failed_before = tally->failed;
  for (int r = 0; r < g_rounds_after; r++) {
    if (r == kWarmup) warm = usageNow();
    checkLayer(s, all, all[rank], rank, comm, tally);
  }
  const Usage end = usageNow();
  const bool same = g_rounds_after <= kWarmup ||
                    (end.fds == warm.fds && end.threads == warm.threads && end.verbs == warm.verbs &&
                     end.rss_kb - warm.rss_kb <= kRssSlackKb);
  printf("after the shrink, rank %d: %d layers (%d failed checks): descriptors %d before the death, %d -> %d, "
         "threads %d -> %d, verbs objects %ld before the death, %ld -> %ld, resident %ld -> %ld KiB%s\n",
         rank, g_rounds_after, tally->failed - failed_before, before_death.fds, warm.fds, end.fds, warm.threads,
         end.threads, before_death.verbs, warm.verbs, end.verbs, warm.rss_kb, end.rss_kb, same ? "" : "  GREW");
  tally->check(same, "nothing grows over the layers after a shrink", rank);
  // A rank on another node than the dead one had network connections to it
  // (socket streams; QPs and their CQs over ibverbs): closed now.
  std::vector<int> node_of(size_t(s.nranks), 0);
  int nodes = 0;
  epCommNodes(comm, &nodes, node_of.data());
  const bool had_net = nodes > 1 && node_of[size_t(rank)] != node_of[1];
  const long held_before = before_death.fds + std::max(before_death.verbs, 0L);
  const long held_end = end.fds + std::max(end.verbs, 0L);
  tally->check(had_net ? held_end < held_before : held_end <= held_before,
               had_net ? "fewer descriptors and verbs objects than before the death (its connections closed)"
                       : "no more descriptors and verbs objects than before the death",
               rank);
}

void runCase(const LLShape& s, const LaunchInfo& li, const epUniqueId& id, bool shrink, Tally* tally) {
  const int rank = li.rank, R = s.nranks;
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = s.experts;
  cfg.hidden = s.hidden;
  cfg.max_tokens_per_rank = s.max_tokens;
  cfg.max_topk = s.topk;
  cfg.backend = epBackendHost;
  cfg.low_latency = 1;
  if (shrink) {
    cfg.enable_shrink = 1;
    cfg.timeout_ms = g_shrink_notice ? 20000 : 6000;
  }
  epComm_t comm = nullptr;
  if (epCommInitRank(&comm, R, id, rank, &cfg) != epSuccess) {
    fprintf(stderr, "init: %s\n", epGetLastError(nullptr));
    tally->check(false, "init", rank);
    return;
  }
  std::vector<Input> all;
  for (int r = 0; r < R; r++) all.push_back(makeInput(s, r));
  const double first_began = wallSeconds();
  if (!(shrink && g_shrink_first_ll)) checkLayer(s, all, all[rank], rank, comm, tally);
  g_layer_before_ms = (wallSeconds() - first_began) * 1e3;
  if (shrink && g_shrink_notice && R > 1) {
    int dead[16], ndead = -1;
    if (rank != 0) {
      const auto t0 = std::chrono::steady_clock::now();
      std::string why;
      const epResult_t failed = failingDispatch(s, all, rank, comm, &why);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tally->check(failed == epRemoteError && why.find("rank 0 began epCommShrink") != std::string::npos,
                   "a dispatch waiting for a rank in epCommShrink ends, naming that rank", rank);
      tally->check(took < 5.0, "well before the timeout", rank);
      if (failed != epRemoteError || took >= 5.0) fprintf(stderr, "rank %d: %.2f s: %s\n", rank, took, why.c_str());
    }
    const epResult_t shrunk = epCommShrink(comm, nullptr, 0, dead, &ndead);
    if (shrunk != epSuccess) fprintf(stderr, "rank %d: epCommShrink: %s\n", rank, epGetLastError(comm));
    tally->check(shrunk == epSuccess && ndead == 0, "a shrink with nobody dead finds nobody", rank);
    if (shrunk == epSuccess) checkLayer(s, all, all[rank], rank, comm, tally);
  } else if (shrink && R > 2) {
    // A high-throughput handle of every rank, made before the death.
    const int Kc = s.topk_of[rank];
    std::vector<uint16_t> ht_recv(size_t(R) * s.max_tokens * size_t(s.hidden) + 1);
    epDispatchArgs_t pa = EP_DISPATCH_ARGS_INITIALIZER;
    pa.x = all[rank].x.data();
    pa.x_type = epBfloat16;
    pa.topk_idx = all[rank].topk.data();
    pa.topk_idx_type = epInt64;
    pa.num_tokens = s.tokens[rank];
    pa.num_topk = Kc;
    pa.recv_x = ht_recv.data();
    pa.recv_capacity = int64_t(R) * s.max_tokens;
    epHandle_t old = nullptr;
    tally->check(epDispatchPrepare(comm, &pa, &old, nullptr) == epSuccess, "a prepare before the death", rank);
    // And a low-latency dispatch never combined: destroyed after the shrink,
    // it must not hold its buffer set (the shrink freed it).
    LLRecvBuffers ll_bufs;
    const epLowLatencyDispatchArgs_t la0 = realInputLLArgs(s, all, rank, &ll_bufs);
    epHandle_t ll_old = nullptr;
    if (!g_shrink_first_ll)
      tally->check(epLowLatencyDispatch(comm, &la0, &ll_old, nullptr) == epSuccess,
                   "a low-latency dispatch before the death, never combined", rank);
    // Rank 1 dies: the others find it after taking rank 0's chunks, and the
    // higher ranks' chunks of the failed step stay in the rings (dropped after the shrink).
    const int gone = 1;
    if (rank == gone) {
      // Dies between calls: the others meet it in their next dispatch. Its
      // last chunks of the layer above may still be on their way (a network
      // transport's thread sends them): they are given a second first.
      sleep(1);
      noteDeathTime();
      fflush(stdout);
      if (g_shrink_hang) {
        // Hangs instead, every thread of it stopped (its sockets stay open);
        // a child of its own wakes it once the survivors are done, and it
        // exits as the dead rank of --shrink does.
        const pid_t self = getpid();
        if (fork() == 0) {
          sleep(unsigned(g_hang_seconds));
          kill(self, SIGCONT);
          _exit(0);
        }
        raise(SIGSTOP);
      }
      _exit(0);
    }
    const Usage before_death = usageNow();
    const double call_began = wallSeconds();
    dispatchMeetsDeath(s, all, rank, comm, gone, tally);
    const double failed_at = wallSeconds();
    const int L = s.experts / R;
    int dead[16], ndead = -1;
    const epResult_t shrunk = epCommShrink(comm, nullptr, 0, dead, &ndead);
    const double shrunk_at = wallSeconds();
    if (shrunk != epSuccess) fprintf(stderr, "rank %d: epCommShrink: %s\n", rank, epGetLastError(comm));
    tally->check(shrunk == epSuccess && ndead == 1 && dead[0] == gone, "the survivors agree on the dead rank", rank);
    if (shrunk != epSuccess) {
      epCommDestroy(comm);
      return;
    }
    int queried[16] = {-1}, nqueried = -1;
    unsigned int epoch = 0;
    tally->check(epCommDeadRanks(comm, queried, 16, &nqueried, &epoch) == epSuccess && nqueried == 1 &&
                     queried[0] == gone && epoch == 1,
                 "epCommDeadRanks says the same, epoch 1", rank);
    // The reference without it: no tokens of its own, its experts -1 everywhere.
    LLShape masked = s;
    masked.tokens[gone] = 0;
    std::vector<Input> kept = all;
    kept[size_t(gone)] = Input();
    for (int r = 0; r < R; r++)
      for (int64_t& e : kept[size_t(r)].topk)
        if (e >= 0 && e / L == gone) e = -1;
    // A handle made before the shrink is refused (its routing names the dead rank).
    epHandle_t again = old;
    tally->check(old != nullptr && epDispatch(comm, &pa, &again, nullptr) == epInvalidUsage &&
                     std::string(epGetLastError(comm)).find("before epCommShrink") != std::string::npos,
                 "a handle from before the shrink is refused", rank);
    if (old) epHandleDestroy(old);
    if (ll_old) epHandleDestroy(ll_old);
    int nodes = 0;
    epCommNodes(comm, &nodes, nullptr);
    if (nodes > 1 && !g_interleave_ht)  // high throughput across nodes: a dead rail peer's substitute forwards
      interleavedHighThroughput(masked, kept, all[rank], rank, comm, tally);
    const double layer_began = wallSeconds();
    checkLayer(masked, kept, all[rank], rank, comm, tally);
    reportRecovery(rank, gone, call_began, failed_at, shrunk_at, layer_began, wallSeconds());
    checkLayer(masked, kept, all[rank], rank, comm, tally);  // both buffer sets, after the destroyed handle's
    if (g_rounds_after > 0) soakAfterShrink(masked, kept, rank, comm, before_death, tally);
    // The layout of the real ids counts no token for the dead rank.
    const int K = s.topk_of[rank], T = s.tokens[rank];
    std::vector<int> per_rank(size_t(R), -1), want(size_t(R), 0);
    for (int t = 0; t < T; t++)
      for (int r = 0; r < R; r++) {
        bool to = false;
        for (int k = 0; k < K; k++) to |= kept[size_t(rank)].topk[size_t(t) * K + k] / L == r &&
                                          kept[size_t(rank)].topk[size_t(t) * K + k] >= 0;
        want[size_t(r)] += to;
      }
    epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
    la.topk_idx = all[rank].topk.data();
    la.topk_idx_type = epInt64;
    la.num_tokens = T;
    la.num_topk = K;
    la.tokens_per_rank = per_rank.data();
    tally->check(epLayout(comm, &la, nullptr) == epSuccess && per_rank == want,
                 "the layout after the shrink counts no token for the dead rank", rank);
    if (g_shrink_twice && R >= 4) {
      // A second death, the last rank: the survivors shrink again (epoch 2,
      // the dead set both ranks) and go on without either.
      const int gone2 = R - 1;
      if (rank == gone2) {
        sleep(1);
        fflush(stdout);
        _exit(0);
      }
      dispatchMeetsDeath(s, all, rank, comm, gone2, tally);
      ndead = -1;
      const epResult_t again2 = epCommShrink(comm, nullptr, 0, dead, &ndead);
      if (again2 != epSuccess) fprintf(stderr, "rank %d: epCommShrink: %s\n", rank, epGetLastError(comm));
      tally->check(again2 == epSuccess && ndead == 2 && dead[0] == gone && dead[1] == gone2,
                   "a second shrink: the dead set is both ranks", rank);
      if (again2 != epSuccess) {
        epCommDestroy(comm);
        return;
      }
      epoch = 0;
      tally->check(epCommDeadRanks(comm, queried, 16, &nqueried, &epoch) == epSuccess && nqueried == 2 && epoch == 2,
                   "epCommDeadRanks: both, epoch 2", rank);
      LLShape masked2 = masked;
      masked2.tokens[gone2] = 0;
      std::vector<Input> kept2 = kept;
      kept2[size_t(gone2)] = Input();
      for (int r = 0; r < R; r++)
        for (int64_t& e : kept2[size_t(r)].topk)
          if (e >= 0 && e / L == gone2) e = -1;
      if (nodes > 1) interleavedHighThroughput(masked2, kept2, all[rank], rank, comm, tally);
      checkLayer(masked2, kept2, all[rank], rank, comm, tally);
    }
  }
  epCommDestroy(comm);
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 2, cases = 10;
  uint64_t seed = 3;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "-n" && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (arg == "--cases" && i + 1 < argc) cases = atoi(argv[++i]);
    else if (arg == "--seed" && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (arg == "--interleave-ht") g_interleave_ht = true;
    else if (arg == "--shrink") g_shrink = true;
    else if (arg == "--shrink-notice") g_shrink = g_shrink_notice = true;
    else if (arg == "--shrink-first-ll") g_shrink = g_shrink_first_ll = true;
    else if (arg == "--shrink-twice") g_shrink = g_shrink_twice = true;
    else if (arg == "--shrink-hang") g_shrink = g_shrink_hang = true;
    else if (arg == "--rounds-after" && i + 1 < argc) g_rounds_after = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [-n RANKS] [--cases C] [--seed S] [--interleave-ht] [--shrink | --shrink-notice | --shrink-first-ll | --shrink-twice | --shrink-hang] [--rounds-after N]\n",
              argv[0]);
      return 2;
    }
  }
  if (nranks < 1 || nranks > 16) return 2;
  std::vector<epUniqueId> ids(cases);
  LaunchInfo li;
  if (launchRanksWithIds(nranks, 600, cases, ids.data(), &li) != 0) return 1;
  Tally tally;
  // --shrink: the last case only (its last rank does not come back).
  for (int c = 0; c < cases; c++) runCase(makeShape(li.nranks, seed, c), li, ids[c], g_shrink && c == cases - 1, &tally);
  printf("mp_lowlat rank %d/%d: %d passed, %d failed\n", li.rank, li.nranks, tally.passed, tally.failed);
  return tally.failed == 0 ? 0 : 1;
}
