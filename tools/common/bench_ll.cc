#include "bench_ll.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "numeric.h"

namespace tools {

namespace {

// What each rank reports to rank 0.
struct LLRankReport : RankStatus {
  int64_t recv_rows = -1;     // (token, local expert) rows received in the first pass
  double pairs = 0;           // valid (token, expert) pairs of this rank's tokens
  double remote_records = 0;  // (token, destination rank other than this one) records
  double buffer_bytes = -1;   // epLowLatencyBufferBytes
  LLCallTimes dispatch, combine;
};

// One iteration's times on this rank (us); -1: the call did not run.
struct LLSample {
  double dispatch_send = -1, dispatch_recv = -1, combine_send = -1, combine_recv = -1;
};

// The timed iterations' samples of one call on this rank.
struct CallSamples {
  std::vector<double> whole, send, recv;

  void add(double send_us, double recv_us, bool split) {
    whole.push_back(split ? send_us + recv_us : send_us);
    if (split) {
      send.push_back(send_us);
      recv.push_back(recv_us);
    }
  }
  static CallTimes stats(const std::vector<double>& v) { return {median(v), percentile(v, 99)}; }
  LLCallTimes times() const { return {stats(whole), stats(send), stats(recv)}; }
};

// The largest over ranks, of each statistic.
void takeMax(LLCallTimes* acc, const LLCallTimes& r) {
  for (auto [a, b] : {std::make_pair(&acc->whole, &r.whole), std::make_pair(&acc->send, &r.send),
                      std::make_pair(&acc->recv, &r.recv)}) {
    a->median = std::max(a->median, b->median);
    a->p99 = std::max(a->p99, b->p99);
  }
}

// ---- One shape on one rank -------------------------------------------------

// x is BF16 (spec_.type); the wire is wire_.
class LLRun : BenchRankRun {
 public:
  LLRun(const BenchOptions& opt, const BenchShape& shape, ControlChannel* ctl, BenchDevice* dev);
  // The first pass, then the warm-up and timed ones, all ranks in step (as
  // ShapeRun::run of ep_bench.cc).
  LLRankReport run(const epUniqueId& id);

 private:
  void allocate();
  void fillInputs();
  void poisonOutputs();
  double timed(const char* call, const std::function<epResult_t()>& fn);
  bool pass(bool first, LLSample* sample);
  void checkDispatch();
  void runExpert();
  void checkCombine();
  void countRecords(LLRankReport* rep) const;

  LLWire wire_;
  int L_;
  size_t cap_;  // rows per local expert: ranks * max_tokens_per_rank
  int64_t recv_rows_ = -1;
  double buffer_bytes_ = -1;
  CallSamples dispatch_, combine_;

  DeviceBuffer x_, topk_idx_, topk_weights_;
  DeviceBuffer recv_x_, recv_scales_, recv_count_, recv_src_, y_, out_;
};

LLRun::LLRun(const BenchOptions& opt, const BenchShape& shape, ControlChannel* ctl, BenchDevice* dev)
    : BenchRankRun(opt, shape, epBfloat16, ctl, dev) {
  wire_.type = opt.type;
  wire_.pow2_scales = opt.pow2_scales;
  L_ = spec_.localExperts();
  cap_ = size_t(spec_.nranks) * size_t(shape.tokens);
}

void LLRun::allocate() {
  const size_t H = size_t(spec_.hidden), K = size_t(spec_.topk), T = size_t(T_), L = size_t(L_);
  const size_t nb = size_t(spec_.scaleBlocks()), rb = H * elementBytes(wire_.type);
  try {
    x_ = DeviceBuffer(dev_, T * H * sizeof(uint16_t));
    topk_idx_ = DeviceBuffer(dev_, T * K * sizeof(int64_t));
    topk_weights_ = DeviceBuffer(dev_, T * K * sizeof(float));
    recv_x_ = DeviceBuffer(dev_, L * cap_ * rb);
    recv_scales_ = DeviceBuffer(dev_, wire_.type == epFloat8E4M3 ? L * nb * cap_ * sizeof(float) : 0);
    recv_count_ = DeviceBuffer(dev_, L * sizeof(int));
    recv_src_ = DeviceBuffer(dev_, L * cap_ * sizeof(int));
    y_ = DeviceBuffer(dev_, L * cap_ * H * sizeof(uint16_t));
    out_ = DeviceBuffer(dev_, T * H * sizeof(uint16_t));
  } catch (const std::bad_alloc&) {
    fail("out of memory allocating the buffers of " + std::to_string(T_) + " tokens and " +
         std::to_string(L_) + " local experts of " + std::to_string(cap_) + " rows");
  }
}

// Generates this rank's inputs on the host and moves them to the device.
void LLRun::fillInputs() {
  const size_t K = size_t(spec_.topk);
  std::vector<uint16_t> x(size_t(T_) * size_t(spec_.hidden));
  std::vector<int64_t> idx(size_t(T_) * K);
  std::vector<float> w(size_t(T_) * K);
  RankInputs(spec_, rank_).fill(x.data(), nullptr, idx.data(), w.data());
  if (!x.empty()) dev_->upload(x_.get(), x.data(), x_.bytes());
  if (!idx.empty()) dev_->upload(topk_idx_.get(), idx.data(), topk_idx_.bytes());
  if (!w.empty()) dev_->upload(topk_weights_.get(), w.data(), topk_weights_.bytes());
}

// Before the checked pass: outputs full of bytes the library would never write
// (counts and sources of 0x55555555, bf16 0xffff is a NaN), so a skipped element shows.
void LLRun::poisonOutputs() {
  for (DeviceBuffer* b : {&recv_x_, &recv_scales_, &recv_count_, &recv_src_})
    if (b->bytes()) dev_->fill(b->get(), 0x55, b->bytes());
  if (out_.bytes()) dev_->fill(out_.get(), 0xff, out_.bytes());
}

// A barrier (every rank makes it, whatever failed), then fn on this rank if
// nothing failed yet, timed with the host clock plus the device's synchronize.
// Returns the time in us, -1 when fn did not run or failed.
double LLRun::timed(const char* call, const std::function<epResult_t()>& fn) {
  barrier();
  if (!ok()) return -1;
  const auto start = BenchClock::now();
  const epResult_t res = fn();
  dev_->synchronize();
  const double us = elapsedUs(start);
  if (res != epSuccess) {
    apiFail(call, res, comm_);
    return -1;
  }
  return us;
}

// One dispatch and the combine of its handle, each whole or (--split) as its
// send half and receive half. On the first pass, between them, the dispatch
// outputs are checked (--check) and the expert fills y; after them the combine
// output is checked.
bool LLRun::pass(bool first, LLSample* sample) {
  const unsigned split = opt_.split ? EP_LL_SEND_ONLY : 0u;
  epLowLatencyDispatchArgs_t d = EP_LL_DISPATCH_ARGS_INITIALIZER;
  d.flags = split | (wire_.pow2_scales ? EP_LL_ROUND_SCALE_POW2 : 0u);
  d.x = x_.get();
  d.topk_idx = topk_idx_.get();
  d.topk_idx_type = epInt64;
  d.topk_weights = topk_weights_.as<float>();
  d.num_tokens = T_;
  d.num_topk = spec_.topk;
  d.wire_type = wire_.type;
  d.recv_x = recv_x_.get();
  d.recv_scales = recv_scales_.as<float>();
  d.recv_count = recv_count_.as<int>();
  d.recv_src = recv_src_.as<int>();
  epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
  c.flags = split;
  c.y = y_.get();
  c.out = out_.get();
  epHandle_t h = nullptr;
  const epStream_t stream = dev_->stream();

  sample->dispatch_send =
      timed("epLowLatencyDispatch", [&] { return epLowLatencyDispatch(comm_, &d, &h, stream); });
  if (opt_.split)
    sample->dispatch_recv =
        timed("epLowLatencyComplete (dispatch)", [&] { return epLowLatencyComplete(comm_, h, stream); });
  if (first && ok()) {
    if (opt_.check) checkDispatch();
    runExpert();
  }
  sample->combine_send =
      timed("epLowLatencyCombine", [&] { return epLowLatencyCombine(comm_, &c, h, stream); });
  if (opt_.split)
    sample->combine_recv =
        timed("epLowLatencyComplete (combine)", [&] { return epLowLatencyComplete(comm_, h, stream); });
  if (first && ok() && opt_.check) checkCombine();
  if (h != nullptr) epHandleDestroy(h);
  return ok();
}

void LLRun::checkDispatch() {
  std::vector<unsigned char> s0, s1, s2, s3;
  LLDispatchOutputs got;
  got.recv_x = dev_->hostView(recv_x_.get(), recv_x_.bytes(), &s0);
  if (recv_scales_.bytes())
    got.recv_scales =
        static_cast<const float*>(dev_->hostView(recv_scales_.get(), recv_scales_.bytes(), &s1));
  got.recv_count = static_cast<const int*>(dev_->hostView(recv_count_.get(), recv_count_.bytes(), &s2));
  got.recv_src = static_cast<const int*>(dev_->hostView(recv_src_.get(), recv_src_.bytes(), &s3));
  checkLowLatencyDispatch(spec_, rank_, wire_, got, &log_);
}

// The expert: y[e][slot] = expertRow(the values of recv_x[e][slot]) for the
// rows recv_count says each local expert received (counted in recv_rows_).
void LLRun::runExpert() {
  const size_t H = size_t(spec_.hidden), nb = size_t(spec_.scaleBlocks());
  const size_t rb = H * elementBytes(wire_.type);
  std::vector<unsigned char> s0, s1, s2;
  const auto* recv = static_cast<const unsigned char*>(dev_->hostView(recv_x_.get(), recv_x_.bytes(), &s0));
  const float* recv_scales =
      recv_scales_.bytes()
          ? static_cast<const float*>(dev_->hostView(recv_scales_.get(), recv_scales_.bytes(), &s1))
          : nullptr;
  const auto* count = static_cast<const int*>(dev_->hostView(recv_count_.get(), recv_count_.bytes(), &s2));
  ProblemSpec on_wire = spec_;
  on_wire.type = wire_.type;
  std::vector<float> values(H), scales(nb);
  std::vector<uint16_t> y(H);
  recv_rows_ = 0;
  for (int e = 0; e < L_; e++) {
    const size_t rows = size_t(std::min<int64_t>(std::max(count[e], 0), int64_t(cap_)));
    recv_rows_ += int64_t(rows);
    for (size_t slot = 0; slot < rows; slot++) {
      const size_t at = size_t(e) * cap_ + slot;
      if (recv_scales != nullptr)  // [L, nb, cap]: one row's scales are cap apart
        for (size_t b = 0; b < nb; b++) scales[b] = recv_scales[(size_t(e) * nb + b) * cap_ + slot];
      rowToValues(on_wire, recv + at * rb, scales.data(), values.data());
      expertRow(values.data(), spec_.hidden, rank_, y.data());
      dev_->upload(y_.as<uint16_t>() + at * H, y.data(), H * sizeof(uint16_t));
    }
  }
}

void LLRun::checkCombine() {
  std::vector<unsigned char> s0;
  const auto* out = static_cast<const uint16_t*>(dev_->hostView(out_.get(), out_.bytes(), &s0));
  checkLowLatencyCombine(spec_, rank_, wire_, out, &log_);
}

// From the routing of this rank's tokens: the valid (token, expert) pairs and
// the (token, destination rank other than this one) records.
void LLRun::countRecords(LLRankReport* rep) const {
  RankInputs in(spec_, rank_);
  std::vector<int64_t> ids(size_t(spec_.topk));
  std::vector<char> to(size_t(spec_.nranks));
  for (int t = 0; t < T_; t++) {
    in.topk(t, ids.data());
    std::fill(to.begin(), to.end(), 0);
    for (int64_t e : ids)
      if (e >= 0) {
        rep->pairs += 1;
        to[size_t(spec_.ownerOf(e))] = 1;
      }
    for (int r = 0; r < spec_.nranks; r++) rep->remote_records += r != rank_ && to[size_t(r)] ? 1 : 0;
  }
}

LLRankReport LLRun::run(const epUniqueId& id) {
  // dispatch_type (BF16, as x) is the high-throughput wire; each low-latency call names its own.
  epConfig_t cfg = config();
  cfg.low_latency = 1;
  size_t bytes = 0;
  if (epLowLatencyBufferBytes(&cfg, spec_.nranks, &bytes) == epSuccess) buffer_bytes_ = double(bytes);
  initComm(id, cfg);
  if (ok()) allocate();
  if (ok()) fillInputs();
  if (ok() && opt_.check) poisonOutputs();
  LLSample sample;
  pass(true, &sample);
  for (int i = 0; i < opt_.warmup + opt_.iters; i++)
    if (pass(false, &sample) && i >= opt_.warmup) {
      dispatch_.add(sample.dispatch_send, sample.dispatch_recv, opt_.split);
      combine_.add(sample.combine_send, sample.combine_recv, opt_.split);
    }

  LLRankReport rep;
  fillStatus(&rep);
  rep.recv_rows = recv_rows_;
  rep.buffer_bytes = buffer_bytes_;
  countRecords(&rep);
  rep.dispatch = dispatch_.times();
  rep.combine = combine_.times();
  return rep;
}

// ---- Results, on rank 0 ------------------------------------------------------

LLShapeResult summarize(const BenchOptions& opt, const BenchShape& shape,
                        const std::vector<LLRankReport>& reps) {
  LLShapeResult res;
  res.shape = shape;
  double rows = 0, pairs = 0, remote = 0;
  bool all_timed = true;
  for (const LLRankReport& r : reps) {
    res.add(r);
    rows += double(r.recv_rows);
    pairs += r.pairs;
    remote += r.remote_records;
    all_timed = all_timed && r.dispatch.whole.median >= 0 && r.combine.whole.median >= 0 && r.recv_rows >= 0;
    takeMax(&res.dispatch, r.dispatch);
    takeMax(&res.combine, r.combine);
    res.buffer_bytes = std::max(res.buffer_bytes, r.buffer_bytes);
  }
  if (!all_timed || reps.empty()) {
    res.dispatch = res.combine = LLCallTimes{};
    return res;
  }
  const double n = double(reps.size()), H = double(shape.hidden);
  // A wire row and, on FP8, its float32 scales, one per 128 values.
  const int scale_blocks = opt.type == epFloat8E4M3 ? (shape.hidden + 127) / 128 : 0;
  const double record = H * double(elementBytes(opt.type)) + 4.0 * scale_blocks;
  res.recv_rows = rows / n;
  res.dispatch_bytes = pairs / n * record;
  res.combine_bytes = pairs / n * H * 2;
  res.dispatch_phys_bytes = remote / n * record;
  res.combine_phys_bytes = remote / n * H * 4;
  // GB/s = bytes / (us * 1e3).
  auto gbps = [](double bytes, double us) { return us > 0 ? bytes / (us * 1e3) : -1; };
  res.dispatch_gbps = gbps(res.dispatch_bytes, res.dispatch.whole.median);
  res.dispatch_phys_gbps = gbps(res.dispatch_phys_bytes, res.dispatch.whole.median);
  res.combine_gbps = gbps(res.combine_bytes, res.combine.whole.median);
  res.combine_phys_gbps = gbps(res.combine_phys_bytes, res.combine.whole.median);
  return res;
}

// The columns of one call: median, p99, (--split) the halves' medians, GB/s, physical GB/s.
std::string callColumns(const BenchOptions& opt, const LLCallTimes& t, double gbps, double phys_gbps) {
  char buf[160];
  std::string s;
  snprintf(buf, sizeof(buf), " %12s %9s", number(t.whole.median, 1).c_str(), number(t.whole.p99, 1).c_str());
  s += buf;
  if (opt.split) {
    snprintf(buf, sizeof(buf), " %9s %9s", number(t.send.median, 1).c_str(),
             number(t.recv.median, 1).c_str());
    s += buf;
  }
  snprintf(buf, sizeof(buf), " %9s %10s", number(gbps, 2).c_str(), number(phys_gbps, 2).c_str());
  return s + buf;
}

std::string callColumnNames(const BenchOptions& opt, const char* call) {
  char buf[160];
  snprintf(buf, sizeof(buf), " %12s %9s%s %9s %10s", (std::string(call) + "_us").c_str(), "p99_us",
           opt.split ? "   send_us   recv_us" : "", "GB/s", "phys_GB/s");
  return buf;
}

// One call's JSON fields, each name prefixed with the call's.
std::string jsonCall(const char* call, const LLCallTimes& t, double bytes, double gbps, double phys_bytes,
                     double phys_gbps) {
  const std::string c = std::string(",\"") + call;
  return c + "_us\":" + jsonNumber(t.whole.median, 1) + c + "_p99_us\":" + jsonNumber(t.whole.p99, 1) + c +
         "_send_us\":" + jsonNumber(t.send.median, 1) + c + "_send_p99_us\":" + jsonNumber(t.send.p99, 1) +
         c + "_recv_us\":" + jsonNumber(t.recv.median, 1) + c +
         "_recv_p99_us\":" + jsonNumber(t.recv.p99, 1) + c + "_bytes\":" + jsonNumber(bytes, 0) + c +
         "_gbps\":" + jsonNumber(gbps, 3) + c + "_phys_bytes\":" + jsonNumber(phys_bytes, 0) + c +
         "_phys_gbps\":" + jsonNumber(phys_gbps, 3);
}

}  // namespace

LLShapeResult runLowLatencyShape(const BenchOptions& opt, const BenchShape& shape, ControlChannel* ctl,
                                 BenchDevice* dev) {
  return summarize(opt, shape, runOnRanks<LLRankReport>(ctl, [&](const epUniqueId& id) {
                     LLRun run(opt, shape, ctl, dev);
                     return run.run(id);
                   }));
}

void printLowLatencyHeader(const BenchOptions& opt, const LaunchInfo& li, const char* backend) {
  printBanner(li, backend);
  const bool fp8 = opt.type == epFloat8E4M3;
  printf(
      "# mode ll: epLowLatencyDispatch / epLowLatencyCombine, config.low_latency = 1, max_tokens_per_rank = "
      "tokens\n");
  printf("# wire %s%s, combine bf16; %s; warmup %d, iters %d; check %s; seed %" PRIu64 "%s\n",
         typeName(opt.type),
         fp8 ? (opt.pow2_scales ? " (quantised by the library, a float32 scale per 128 values, powers of two)"
                                : " (quantised by the library, a float32 scale per 128 values)")
             : "",
         opt.split ? "split calls (EP_LL_SEND_ONLY + epLowLatencyComplete)" : "whole calls", opt.warmup,
         opt.iters, opt.check ? "on (counts, sources, rows, combine)" : "off", opt.seed,
         opt.zero_rank0 ? "; rank 0 has no tokens" : "");
  printf(
      "# time: median and p99 (nearest rank) of each rank's timed calls, largest over ranks (us); a barrier "
      "precedes each call%s\n",
      opt.split ? "\n#   and each half; a call is its send half + receive half; send_us, recv_us: medians of "
                  "the halves"
                : "");
  printf(
      "# GB/s (DeepEP): (token, expert) pairs a rank sends * (wire row + scales) for dispatch, * hidden * 2 "
      "for combine\n");
  printf(
      "# phys_GB/s: what crosses between ranks: a wire row + scales per (token, other destination rank) for\n"
      "#   dispatch, a float32 row per (token, rank other than its home) for combine\n");
  printf("# bw: bytes per rank, mean over ranks / the largest median\n");
  printf("#\n");
  printf("%s %10s%s%s  %s\n", shapeColumnNames("wire").c_str(), "recv_rows",
         callColumnNames(opt, "dispatch").c_str(), callColumnNames(opt, "combine").c_str(), "check");
  fflush(stdout);
}

void printLowLatencyResult(const BenchOptions& opt, const LLShapeResult& r, int nranks, const char* backend) {
  if (opt.json) {
    printf(
        "{\"mode\":\"ll\",%s,\"pow2_scales\":%s,\"split\":%s,\"zero_rank0\":%s,\"warmup\":%d,\"iters\":%d,"
        "\"recv_rows\":%s%s%s,\"ll_buffer_bytes\":%s,%s}\n",
        jsonShape(r.shape, nranks, opt.type, backend).c_str(), opt.pow2_scales ? "true" : "false",
        opt.split ? "true" : "false", opt.zero_rank0 ? "true" : "false", opt.warmup, opt.iters,
        jsonNumber(r.recv_rows, 1).c_str(),
        jsonCall("dispatch", r.dispatch, r.dispatch_bytes, r.dispatch_gbps, r.dispatch_phys_bytes,
                 r.dispatch_phys_gbps)
            .c_str(),
        jsonCall("combine", r.combine, r.combine_bytes, r.combine_gbps, r.combine_phys_bytes,
                 r.combine_phys_gbps)
            .c_str(),
        jsonNumber(r.buffer_bytes, 0).c_str(), jsonStatus(r).c_str());
  } else {
    printf("%s %10s%s%s  %s\n", shapeColumns(r.shape, nranks, opt.type).c_str(),
           number(r.recv_rows, 1).c_str(),
           callColumns(opt, r.dispatch, r.dispatch_gbps, r.dispatch_phys_gbps).c_str(),
           callColumns(opt, r.combine, r.combine_gbps, r.combine_phys_gbps).c_str(), checkWord(r, "-"));
    printStatusNotes(r);
  }
  fflush(stdout);
}

}  // namespace tools
