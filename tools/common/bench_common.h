// The parts of ep_bench that its two modes share: the options, statistics and
// number formatting, what a rank reports about its checks and failures, the
// base of one shape's run on one rank, and the exchange of a shape's unique id
// and of the ranks' reports over the control channel. The high-throughput mode
// lives in ep_bench.cc, the low-latency mode in bench_ll.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/bench_device.h"
#include "common/control.h"
#include "common/launch.h"
#include "common/reference.h"
#include "moeep.h"

namespace tools {

using BenchClock = std::chrono::steady_clock;

// ---- Options -------------------------------------------------------------

struct BenchShape {
  int hidden, topk, experts, tokens;
};

enum class BenchMode {
  kHighThroughput,  // --mode ht: epDispatch / epCombine
  kLowLatency       // --mode ll: epLowLatencyDispatch / epLowLatencyCombine
};

struct BenchOptions {
  int nranks = 2;
  BenchMode mode = BenchMode::kHighThroughput;
  std::vector<BenchShape> shapes;
  // --hidden/--topk/--experts/--tokens override that field of every shape (-1: keep).
  int hidden = -1, topk = -1, experts = -1, tokens = -1;
  epDataType_t type = epBfloat16;  // ht: dispatch type; ll: wire type
  int warmup = 3, iters = 20;  // figures are medians of 20 timed runs after 3 warm-ups
  bool check = false, json = false, exact = false, zero_rank0 = false;
  bool pow2_scales = false, split = false;  // ll only
  uint64_t seed = 1;
  int timeout_ms = 0;  // 0: the library's EP_TIMEOUT_MS
  std::string backend = "host";
};

// ---- Statistics and formatting ---------------------------------------------

// The control channel failing leaves the ranks unable to agree on anything: fatal.
struct ControlFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// -1 for an empty sample.
double median(std::vector<double> v);
// The nearest-rank percentile: the smallest value with at least pct % of the
// sample at or below it (pct in (0, 100]).
double percentile(std::vector<double> v, double pct);
double elapsedUs(BenchClock::time_point since);

void copyText(char* dst, size_t size, const std::string& src);
// "-" for a negative value (not measured), else v with `decimals` decimals.
std::string number(double v, int decimals);
// "null" for a negative value, else as number().
std::string jsonNumber(double v, int decimals);
std::string jsonString(const std::string& s);

// ---- Checks and failures of a shape ------------------------------------------

// What each rank reports to rank 0 about its checks and failures; the reports
// of both modes begin with it and travel as one control row.
struct RankStatus {
  int32_t error = 0;       // 1: a call failed on this rank (see error_text)
  int32_t checked = 0;     // 1: outputs were checked
  int64_t mismatches = 0;  // wrong elements, all checks together
  char first_mismatch[420] = "";
  char error_text[420] = "";
};

// The same over all ranks, on rank 0 (elsewhere: this rank's own).
struct ShapeStatus {
  int64_t mismatches = 0;
  bool checked = false;
  std::string first_mismatch, error, skipped;  // skipped: why the shape did not run
  bool passed() const { return error.empty() && mismatches == 0; }
  // Adds one rank's report: the first error and first mismatch are kept.
  void add(const RankStatus& r);
};

// OK / FAILED (wrong elements) / ERROR (a call failed) / SKIPPED / unchecked.
const char* checkWord(const ShapeStatus& r, const char* unchecked);
// The same in JSON's lower case.
const char* jsonCheckWord(const ShapeStatus& r);

// The first columns of a result row, which name the shape (hidden, topk,
// experts, tokens, ranks, type), and their header ("# hidden ... type_name").
std::string shapeColumns(const BenchShape& s, int nranks, epDataType_t type);
std::string shapeColumnNames(const char* type_name);
// The same as JSON fields (no braces): "hidden":..,...,"type":..,"backend":..
std::string jsonShape(const BenchShape& s, int nranks, epDataType_t type, const char* backend);
// The check fields that end a JSON result: "check", "mismatches", "first_mismatch", "error", "skipped".
std::string jsonStatus(const ShapeStatus& r);
// "#   first mismatch: ...", "#   error: ...", "#   skipped: ..." lines under a result row.
void printStatusNotes(const ShapeStatus& r);
// The first header line: library version, backend, ranks and how they started.
void printBanner(const LaunchInfo& li, const char* backend);

// ---- One shape on one rank ---------------------------------------------------

// What the runs of both modes have in common: the problem, the communicator,
// this rank's first failure and its mismatch log, and the barrier of the
// control channel.
class BenchRankRun {
 public:
  // x_type: the type of the rows the generator makes (spec_.type).
  BenchRankRun(const BenchOptions& opt, const BenchShape& shape, epDataType_t x_type, ControlChannel* ctl,
               BenchDevice* dev);
  ~BenchRankRun();
  BenchRankRun(const BenchRankRun&) = delete;
  BenchRankRun& operator=(const BenchRankRun&) = delete;

 protected:
  bool ok() const { return comm_ != nullptr && error_.empty(); }
  // Keeps the first failure of this rank (and says it on stderr).
  void fail(const std::string& what);
  void apiFail(const char* call, epResult_t res, epComm_t comm);
  // Throws ControlFailure when the control channel fails.
  void barrier();
  // The shape's config: experts, hidden, tokens (max_tokens_per_rank) and topk
  // of the shape, dispatch type spec_.type, combine bf16, the device's backend
  // and --timeout-ms.
  epConfig_t config() const;
  void initComm(const epUniqueId& id, const epConfig_t& cfg);
  // This rank's failure and checks, for its report.
  void fillStatus(RankStatus* st) const;

  const BenchOptions& opt_;
  ControlChannel* ctl_;
  BenchDevice* dev_;
  int rank_;
  ProblemSpec spec_;
  int T_;  // this rank's tokens
  epComm_t comm_ = nullptr;
  std::string error_;
  MismatchLog log_;
};

// ---- Running a shape on every rank -------------------------------------------

// A fresh unique id per shape: rank 0 makes it, the control channel carries it.
// False (and *error) when rank 0 could not make one.
bool shareShapeId(ControlChannel* ctl, epUniqueId* id, std::string* error);

// Every rank: run(id) with the shape's unique id gives this rank's report
// (Report begins with a RankStatus), or a report of the failure to make the id.
// Returns every rank's report in rank order on rank 0, this rank's own elsewhere.
template <class Report, class Run>
std::vector<Report> runOnRanks(ControlChannel* ctl, Run run) {
  static_assert(sizeof(Report) <= ControlChannel::kPayloadBytes, "a report travels as one control row");
  epUniqueId id;
  std::string id_error;
  Report mine;
  if (shareShapeId(ctl, &id, &id_error)) {
    mine = run(id);
  } else {
    mine.error = 1;
    copyText(mine.error_text, sizeof(mine.error_text), id_error);
  }
  std::vector<Report> all(ctl->rank() == 0 ? size_t(ctl->nranks()) : 0);
  if (ctl->gather(&mine, sizeof(mine), all.data()) != epSuccess) throw ControlFailure(ctl->error());
  if (ctl->rank() != 0) all.assign(1, mine);
  return all;
}

}  // namespace tools
