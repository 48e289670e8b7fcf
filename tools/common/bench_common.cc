#include "bench_common.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "numeric.h"

namespace tools {

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double percentile(std::vector<double> v, double pct) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  // Rank ceil(pct / 100 * n), 1-based.
  const size_t rank = size_t(std::ceil(pct / 100.0 * double(v.size())));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

double elapsedUs(BenchClock::time_point since) {
  return std::chrono::duration<double, std::micro>(BenchClock::now() - since).count();
}

void copyText(char* dst, size_t size, const std::string& src) { snprintf(dst, size, "%s", src.c_str()); }

std::string number(double v, int decimals) {
  if (v < 0) return "-";
  char buf[64];
  snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string jsonNumber(double v, int decimals) { return v < 0 ? "null" : number(v, decimals); }

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

void ShapeStatus::add(const RankStatus& r) {
  if (r.error && error.empty()) error = r.error_text;
  if (r.mismatches > 0 && first_mismatch.empty()) first_mismatch = r.first_mismatch;
  mismatches += r.mismatches;
  checked = r.checked != 0;
}

const char* checkWord(const ShapeStatus& r, const char* unchecked) {
  if (!r.skipped.empty()) return "SKIPPED";
  if (!r.error.empty()) return "ERROR";
  if (!r.checked) return unchecked;
  return r.mismatches == 0 ? "OK" : "FAILED";
}

const char* jsonCheckWord(const ShapeStatus& r) {
  if (!r.skipped.empty()) return "skipped";
  if (!r.error.empty()) return "error";
  if (!r.checked) return "unchecked";
  return r.mismatches == 0 ? "ok" : "failed";
}

std::string shapeColumns(const BenchShape& s, int nranks, epDataType_t type) {
  char buf[160];
  snprintf(buf, sizeof(buf), "  %7d %5d %7d %7d %5d %5s", s.hidden, s.topk, s.experts, s.tokens, nranks,
           typeName(type));
  return buf;
}

std::string shapeColumnNames(const char* type_name) {
  char buf[160];
  snprintf(buf, sizeof(buf), "# %7s %5s %7s %7s %5s %5s", "hidden", "topk", "experts", "tokens", "ranks",
           type_name);
  return buf;
}

std::string jsonShape(const BenchShape& s, int nranks, epDataType_t type, const char* backend) {
  char buf[320];
  snprintf(
      buf, sizeof(buf),
      "\"hidden\":%d,\"topk\":%d,\"experts\":%d,\"tokens\":%d,\"ranks\":%d,\"type\":\"%s\",\"backend\":%s",
      s.hidden, s.topk, s.experts, s.tokens, nranks, typeName(type), jsonString(backend).c_str());
  return buf;
}

std::string jsonStatus(const ShapeStatus& r) {
  return std::string("\"check\":\"") + jsonCheckWord(r) +
         "\",\"mismatches\":" + std::to_string(r.mismatches) +
         ",\"first_mismatch\":" + (r.first_mismatch.empty() ? "null" : jsonString(r.first_mismatch)) +
         ",\"error\":" + (r.error.empty() ? "null" : jsonString(r.error)) +
         ",\"skipped\":" + (r.skipped.empty() ? "null" : jsonString(r.skipped));
}

void printStatusNotes(const ShapeStatus& r) {
  if (!r.first_mismatch.empty())
    printf("#   first mismatch: %s (%" PRId64 " wrong element%s in all)\n", r.first_mismatch.c_str(),
           r.mismatches, r.mismatches == 1 ? "" : "s");
  if (!r.error.empty()) printf("#   error: %s\n", r.error.c_str());
  if (!r.skipped.empty()) printf("#   skipped: %s\n", r.skipped.c_str());
}

void printBanner(const LaunchInfo& li, const char* backend) {
  int lib = 0;
  epGetVersion(&lib);
  printf("# ep_bench: libmoeep %d.%d.%d (built against %d.%d.%d), %s backend, %d rank%s (%s)\n", lib / 10000,
         lib / 100 % 100, lib % 100, EP_VERSION_MAJOR, EP_VERSION_MINOR, EP_VERSION_PATCH, backend, li.nranks,
         li.nranks == 1 ? "" : "s", li.under_mpi ? "one per process of the launcher" : "forked by ep_bench");
}

BenchRankRun::BenchRankRun(const BenchOptions& opt, const BenchShape& shape, epDataType_t x_type,
                           ControlChannel* ctl, BenchDevice* dev)
    : opt_(opt), ctl_(ctl), dev_(dev), rank_(ctl->rank()), log_(ctl->rank()) {
  spec_.seed = opt.seed;
  spec_.nranks = ctl->nranks();
  spec_.hidden = shape.hidden;
  spec_.topk = shape.topk;
  spec_.experts = shape.experts;
  spec_.tokens = shape.tokens;
  spec_.zero_rank0 = opt.zero_rank0;
  spec_.type = x_type;
  T_ = spec_.tokensOf(rank_);
}

BenchRankRun::~BenchRankRun() {
  if (comm_ != nullptr) epCommDestroy(comm_);
}

void BenchRankRun::fail(const std::string& what) {
  if (error_.empty()) error_ = "rank " + std::to_string(rank_) + ": " + what;
  fprintf(stderr, "ep_bench: rank %d: %s\n", rank_, what.c_str());
}

void BenchRankRun::apiFail(const char* call, epResult_t res, epComm_t comm) {
  fail(std::string(call) + " failed: " + epGetErrorString(res) + ": " + epGetLastError(comm));
}

void BenchRankRun::barrier() {
  if (ctl_->barrier() != epSuccess) throw ControlFailure(ctl_->error());
}

epConfig_t BenchRankRun::config() const {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = spec_.experts;
  cfg.hidden = spec_.hidden;
  cfg.max_tokens_per_rank = spec_.tokens;
  cfg.max_topk = spec_.topk;
  cfg.dispatch_type = spec_.type;
  cfg.combine_type = epBfloat16;
  cfg.backend = dev_->backend();
  cfg.timeout_ms = opt_.timeout_ms;
  return cfg;
}

void BenchRankRun::initComm(const epUniqueId& id, const epConfig_t& cfg) {
  epResult_t res = epCommInitRank(&comm_, ctl_->nranks(), id, rank_, &cfg);
  if (res != epSuccess) {
    comm_ = nullptr;
    apiFail("epCommInitRank", res, nullptr);
  }
}

void BenchRankRun::fillStatus(RankStatus* st) const {
  st->error = error_.empty() ? 0 : 1;
  st->checked = opt_.check ? 1 : 0;
  st->mismatches = log_.count();
  copyText(st->first_mismatch, sizeof(st->first_mismatch), log_.first());
  copyText(st->error_text, sizeof(st->error_text), error_);
}

namespace {

// The id and rank 0's failure to make it, as one control row.
struct IdMessage {
  int32_t ok;
  char error[256];
  epUniqueId id;
};
static_assert(sizeof(IdMessage) <= ControlChannel::kPayloadBytes, "one control row");

}  // namespace

bool shareShapeId(ControlChannel* ctl, epUniqueId* id, std::string* error) {
  IdMessage msg;
  memset(&msg, 0, sizeof(msg));
  if (ctl->rank() == 0) {
    epResult_t res = epGetUniqueId(&msg.id);
    msg.ok = res == epSuccess;
    if (!msg.ok)
      snprintf(msg.error, sizeof(msg.error), "rank 0: epGetUniqueId failed: %s: %s", epGetErrorString(res),
               epGetLastError(nullptr));
  }
  if (ctl->broadcast(&msg, sizeof(msg)) != epSuccess) throw ControlFailure(ctl->error());
  *id = msg.id;
  *error = msg.error;
  return msg.ok != 0;
}

}  // namespace tools
