// ep_bench: dispatch and combine of libmoeep, timed and checked, in the manner
// of nccl-tests.
//
//   ep_bench [-n RANKS] [--shape H:K:E:T ...] [--type bf16|fp8|fp16|fp32] [--check] ...
//   ep_bench --mode ll [-n RANKS] [--shape H:K:E:T ...] [--type fp8|bf16] [--split] [--check] ...
//   mpirun -n RANKS ep_bench [options]
//
// --mode ht (the default, this file): epDispatch / epCombine. --mode ll: the
// low-latency calls (common/bench_ll.h), timed and checked in the same way.
//
// Each shape runs on a communicator of its own (config from the shape), on the
// backend of --backend (host only for now; see common/bench_device.h):
//   1. a first, untimed pass: dispatch, the "expert" (y = received row * (1 +
//      0.25 rank), rounded to bf16), combine; under --check every output
//      element is compared with a reference the tool computes itself
//      (common/reference.h), and a cached re-dispatch of new rows with the
//      first pass's handle is checked as well;
//   2. --warmup W untimed and --iters I timed iterations of dispatch (new
//      routing each time, as DeepEP's dispatch computes its layout each call)
//      followed by combine.
//
// Timing. A host monotonic clock around each call (plus the device's
// synchronize(), a no-op on the host backend, where calls return when done).
// Every timed call is preceded by a barrier over the control channel (below),
// so all ranks start together and a rank's time is its own call, not its wait
// for a late peer. Each rank takes the median of its timed iterations; the
// result is the largest median over ranks (a collective ends with its slowest
// rank). In --exact mode "dispatch" is epDispatchPrepare + epHandleRecvCount +
// epDispatch, since sizing the outputs is part of that way of calling it.
//
// Bandwidth: logical, as DeepEP reports it: bytes of every row a rank
// receives, its own included (FP8: plus its scales), divided by the time; the
// mean over ranks of those bytes over the slowest rank's time. Combine counts
// the bf16 rows it sends back, the same rows.
//
// Gathering results: the public API has no barrier or gather, so the ranks
// talk over a small communicator of their own (common/control.h); that works
// with forked ranks and under mpirun alike, and every rank's timing and check
// result reaches rank 0, which prints.
//
// Exit status: 0 when at least one shape ran and every shape that ran was
// right (every checked element); a shape the rank count cannot run (experts
// not a multiple of it) is skipped, counted in the last line, and does not
// fail the run by itself.
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "common/bench_common.h"
#include "common/bench_device.h"
#include "common/bench_ll.h"
#include "common/control.h"
#include "common/launch.h"
#include "common/launcher_env.h"
#include "common/numeric.h"
#include "common/reference.h"
#include "moeep.h"

namespace {

using tools::BenchDevice;
using tools::BenchMode;
using tools::ControlChannel;
using tools::ControlFailure;
using tools::DeviceBuffer;
using tools::ProblemSpec;
using Clock = tools::BenchClock;
using Shape = tools::BenchShape;
using Options = tools::BenchOptions;

// ---- Options -------------------------------------------------------------

const Shape kDefaultShapes[] = {{7168, 8, 256, 4096}, {2560, 6, 64, 1000}};
// --mode ll: DeepEP's low-latency test (128 tokens per rank, hidden 7168, top-8 of 288).
const Shape kDefaultLowLatencyShapes[] = {{7168, 8, 288, 128}};

void usage(FILE* f) {
  fprintf(
      f,
      "usage: ep_bench [options]           (ranks forked by ep_bench)\n"
      "       mpirun -n R ep_bench [options] (one rank per process)\n"
      "  -n, --nranks N        ranks to fork when not under mpirun (default 2)\n"
      "      --mode M          ht (default): epDispatch / epCombine; ll: epLowLatencyDispatch /\n"
      "                        epLowLatencyCombine (config.low_latency = 1, T = max_tokens_per_rank)\n"
      "      --shape H:K:E:T   hidden:topk:experts:tokens per rank; repeatable\n"
      "                        (default: 7168:8:256:4096 and 2560:6:64:1000; ll: 7168:8:288:128)\n"
      "      --hidden H        override H of every shape (likewise --topk K,\n"
      "      --experts E, --tokens T)\n"
      "      --type T          dispatch type: bf16 (default), fp8, fp16, fp32; combine is bf16\n"
      "                        (ll: the wire, fp8 (default; quantised by the library) or bf16)\n"
      "      --pow2-scales     ll, fp8 wire: scales rounded up to powers of two (EP_LL_ROUND_SCALE_POW2)\n"
      "      --split           ll: each call as EP_LL_SEND_ONLY + epLowLatencyComplete, halves timed too\n"
      "      --warmup W        untimed iterations (default 3)\n"
      "      --iters I         timed iterations (default 20)\n"
      "      --check           check every element of dispatch, cached re-dispatch and combine\n"
      "                        (ll: counts, sources and rows of every local expert, and combine)\n"
      "      --exact           size outputs with epDispatchPrepare + epHandleRecvCount\n"
      "                        (default: recv_capacity = ranks * tokens, EP_DISPATCH_NO_HOST_SYNC; ht only)\n"
      "      --zero-rank0      rank 0 has no tokens\n"
      "      --seed S          seed of the generated inputs (default 1)\n"
      "      --timeout-ms MS   config.timeout_ms (default: EP_TIMEOUT_MS)\n"
      "      --backend B       host (default), or cuda: runs ep_bench_gpu with the other arguments\n"
      "                        (EP2+ on the GPUs of this machine: --tokens N, --sms A,B, --types\n"
      "                        bf16|fp8|both, --no-nccl, --quick, --mode ll)\n"
      "      --json            one JSON object per result line on stdout, nothing else\n"
      "  -h, --help            this message\n");
}

bool parseLong(const char* text, long lo, long hi, long* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parseShape(const char* text, Shape* s) {
  long v[4];
  const char* p = text;
  for (int i = 0; i < 4; i++) {
    const char* colon = strchr(p, ':');
    std::string field = (i < 3 && colon != nullptr) ? std::string(p, colon) : std::string(p);
    if ((i < 3) != (colon != nullptr) || !parseLong(field.c_str(), i == 3 ? 0 : 1, 1L << 30, &v[i]))
      return false;
    if (colon != nullptr) p = colon + 1;
  }
  *s = {int(v[0]), int(v[1]), int(v[2]), int(v[3])};
  return true;
}

bool parseType(const char* text, epDataType_t* t) {
  static const struct {
    const char* name;
    epDataType_t type;
  } kTypes[] = {{"bf16", epBfloat16},
                {"fp16", epFloat16},
                {"fp32", epFloat32},
                {"fp8", epFloat8E4M3},
                {"fp8e4m3", epFloat8E4M3}};
  for (const auto& k : kTypes)
    if (strcmp(text, k.name) == 0) {
      *t = k.type;
      return true;
    }
  return false;
}

enum ParseResult { kParsed, kHelp, kBadOptions };

// The options that belong to one mode, and --mode ll's default wire: FP8, as
// DeepEP's low_latency_dispatch (use_fp8=True) and EP_LL_DISPATCH_ARGS_INITIALIZER.
bool checkModeOptions(Options* opt, bool type_given, std::string* error) {
  const bool ll = opt->mode == BenchMode::kLowLatency;
  if (ll && !type_given) opt->type = epFloat8E4M3;
  if (ll && opt->type != epFloat8E4M3 && opt->type != epBfloat16)
    *error = std::string("--mode ll sends fp8 or bf16, not ") + tools::typeName(opt->type) + " (--type)";
  else if (ll && opt->exact)
    *error = "--exact is for --mode ht (low-latency outputs are sized by max_tokens_per_rank)";
  else if (opt->pow2_scales && !(ll && opt->type == epFloat8E4M3))
    *error = "--pow2-scales needs --mode ll with the fp8 wire";
  else if (opt->split && !ll)
    *error = "--split is for --mode ll";
  else
    return true;
  return false;
}

// The option getopt_long just returned, named for a message: the unknown or
// value-less argument as typed (c is '?' or ':'), else the option's long name.
std::string optionName(int c, const option* table, char** argv) {
  if (c == '?' || c == ':') return argv[optind - 1];
  for (const option* o = table; o->name != nullptr; o++)
    if (o->val == c) return std::string("--") + o->name;
  return std::string("-") + char(c);
}

// The long options, for parseOptions and for backendOption (which must find
// --backend as getopt does: abbreviated, or with its value after '=').
enum {
  kShape = 256,
  kHidden,
  kTopk,
  kExperts,
  kTokens,
  kType,
  kWarmup,
  kIters,
  kCheck,
  kJson,
  kSeed,
  kExact,
  kTimeout,
  kZeroRank0,
  kBackend,
  kMode,
  kPow2Scales,
  kSplit
};
const option kLong[] = {{"nranks", required_argument, nullptr, 'n'},
                        {"shape", required_argument, nullptr, kShape},
                        {"hidden", required_argument, nullptr, kHidden},
                        {"topk", required_argument, nullptr, kTopk},
                        {"experts", required_argument, nullptr, kExperts},
                        {"tokens", required_argument, nullptr, kTokens},
                        {"type", required_argument, nullptr, kType},
                        {"warmup", required_argument, nullptr, kWarmup},
                        {"iters", required_argument, nullptr, kIters},
                        {"check", no_argument, nullptr, kCheck},
                        {"json", no_argument, nullptr, kJson},
                        {"seed", required_argument, nullptr, kSeed},
                        {"exact", no_argument, nullptr, kExact},
                        {"timeout-ms", required_argument, nullptr, kTimeout},
                        {"zero-rank0", no_argument, nullptr, kZeroRank0},
                        {"backend", required_argument, nullptr, kBackend},
                        {"mode", required_argument, nullptr, kMode},
                        {"pow2-scales", no_argument, nullptr, kPow2Scales},
                        {"split", no_argument, nullptr, kSplit},
                        {"help", no_argument, nullptr, 'h'},
                        {nullptr, 0, nullptr, 0}};

// The value of the last --backend in argv as getopt_long reads it (any
// abbreviation, "--backend cuda" or "--backend=cuda"); spelled[i] = 1 for the
// arguments that spell it, so that the rest can be passed on. The "-" scan
// keeps argv in order; every other option, known to this tool or not, is
// skipped (the GPU benchmark has options of its own).
std::string backendOption(int argc, char** argv, std::vector<char>* spelled) {
  std::string backend;
  spelled->assign(size_t(argc), 0);
  opterr = 0;
  optind = 0;  // glibc: a fresh scan
  int c;
  while ((c = getopt_long(argc, argv, "-:n:h", kLong, nullptr)) != -1) {
    if (c != kBackend) continue;
    backend = optarg;
    (*spelled)[size_t(optind - 1)] = 1;
    if (optarg == argv[optind - 1]) (*spelled)[size_t(optind - 2)] = 1;  // the value was its own argument
  }
  optind = 0;  // parseOptions scans again from the start
  return backend;
}

ParseResult parseOptions(int argc, char** argv, Options* opt, std::string* error) {
  opterr = 0;  // we print our own message, once
  int c;
  long v = 0;
  bool type_given = false;
  while ((c = getopt_long(argc, argv, ":n:h", kLong, nullptr)) != -1) {
    std::string name = optionName(c, kLong, argv);
    auto bad = [&](const char* what) {
      *error = std::string("bad value '") + (optarg ? optarg : "") + "' for " + name + ": " + what;
      return kBadOptions;
    };
    switch (c) {
      case 'n':
        if (!parseLong(optarg, 1, 4096, &v)) return bad("a rank count 1..4096");
        opt->nranks = int(v);
        break;
      case kShape: {
        Shape s;
        if (!parseShape(optarg, &s)) return bad("H:K:E:T with H, K, E >= 1 and T >= 0");
        opt->shapes.push_back(s);
        break;
      }
      case kHidden:
        if (!parseLong(optarg, 1, 1L << 30, &v)) return bad("a positive integer");
        opt->hidden = int(v);
        break;
      case kTopk:
        if (!parseLong(optarg, 1, 1L << 30, &v)) return bad("a positive integer");
        opt->topk = int(v);
        break;
      case kExperts:
        if (!parseLong(optarg, 1, 1L << 30, &v)) return bad("a positive integer");
        opt->experts = int(v);
        break;
      case kTokens:
        if (!parseLong(optarg, 0, 1L << 30, &v)) return bad("an integer >= 0");
        opt->tokens = int(v);
        break;
      case kType:
        if (!parseType(optarg, &opt->type)) return bad("bf16, fp8, fp16 or fp32");
        type_given = true;
        break;
      case kWarmup:
        if (!parseLong(optarg, 0, 1000000, &v)) return bad("an integer >= 0");
        opt->warmup = int(v);
        break;
      case kIters:
        if (!parseLong(optarg, 1, 1000000, &v)) return bad("an integer >= 1");
        opt->iters = int(v);
        break;
      case kCheck:
        opt->check = true;
        break;
      case kJson:
        opt->json = true;
        break;
      case kSeed: {
        // strtoull skips leading blanks and takes a sign: " -1" would read as 2^64 - 1.
        if (*optarg < '0' || *optarg > '9') return bad("an unsigned integer");
        // Decimal, or hex after 0x; not base 0, which reads "010" as octal 8 and refuses "08".
        const bool hex = optarg[0] == '0' && (optarg[1] == 'x' || optarg[1] == 'X');
        char* end = nullptr;
        errno = 0;
        unsigned long long s = strtoull(optarg, &end, hex ? 16 : 10);
        if (errno != 0 || *end != '\0') return bad("an unsigned integer");
        opt->seed = s;
        break;
      }
      case kExact:
        opt->exact = true;
        break;
      case kTimeout:
        if (!parseLong(optarg, 1, 1L << 30, &v)) return bad("milliseconds >= 1");
        opt->timeout_ms = int(v);
        break;
      case kZeroRank0:
        opt->zero_rank0 = true;
        break;
      case kBackend:
        if (!tools::benchBackendSupported(optarg, error)) return kBadOptions;
        opt->backend = optarg;
        break;
      case kMode:
        if (strcmp(optarg, "ht") == 0)
          opt->mode = BenchMode::kHighThroughput;
        else if (strcmp(optarg, "ll") == 0)
          opt->mode = BenchMode::kLowLatency;
        else
          return bad("ht or ll");
        break;
      case kPow2Scales:
        opt->pow2_scales = true;
        break;
      case kSplit:
        opt->split = true;
        break;
      case 'h':
        return kHelp;
      case ':':
        *error = std::string("option ") + name + " needs a value";
        return kBadOptions;
      default:
        *error = std::string("unknown option ") + name;
        return kBadOptions;
    }
  }
  if (optind < argc) {
    *error = std::string("unexpected argument '") + argv[optind] + "'";
    return kBadOptions;
  }
  if (!checkModeOptions(opt, type_given, error)) return kBadOptions;
  if (opt->shapes.empty()) {
    if (opt->mode == BenchMode::kLowLatency)
      opt->shapes.assign(std::begin(kDefaultLowLatencyShapes), std::end(kDefaultLowLatencyShapes));
    else
      opt->shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  }
  for (Shape& s : opt->shapes) {
    if (opt->hidden >= 0) s.hidden = opt->hidden;
    if (opt->topk >= 0) s.topk = opt->topk;
    if (opt->experts >= 0) s.experts = opt->experts;
    if (opt->tokens >= 0) s.tokens = opt->tokens;
    // After the overrides (--tokens 0) and on the default shapes too.
    if (opt->mode == BenchMode::kLowLatency && s.tokens < 1) {
      *error = "--mode ll needs at least 1 token per rank (--shape or --tokens; T sizes the low-latency buffers)";
      return kBadOptions;
    }
    // The generator draws K distinct experts per token; the library checks the rest.
    if (s.topk > s.experts) {
      *error = "shape " + std::to_string(s.hidden) + ":" + std::to_string(s.topk) + ":" +
               std::to_string(s.experts) + ":" + std::to_string(s.tokens) +
               ": topk must not exceed experts (each token picks K distinct experts)";
      return kBadOptions;
    }
  }
  return kParsed;
}

// ---- What each rank reports to rank 0 --------------------------------------

struct RankReport : tools::RankStatus {
  int64_t recv_rows = -1;  // rows received in the first pass
  int num_nodes = 1;
  int64_t tokens = 0, net_rows_hier = 0, net_rows_flat = 0;  // this rank's tokens, their rows across nodes
  double dispatch_bytes = 0, combine_bytes = 0;
  double dispatch_us = -1, combine_us = -1;  // medians; -1: not measured
};

// ---- One shape on one rank -------------------------------------------------

class ShapeRun : tools::BenchRankRun {
 public:
  ShapeRun(const Options& opt, const Shape& shape, ControlChannel* ctl, BenchDevice* dev);
  // Runs every pass. Whatever fails on this rank, it makes the same control-
  // channel calls as every other rank (throws ControlFailure if those fail).
  RankReport run(const epUniqueId& id);

 private:
  void allocate();
  void fillInputs();
  void poisonOutputs();
  epDispatchArgs_t dispatchArgs(unsigned generation) const;
  bool dispatch(unsigned generation, epHandle_t* handle, double* us);
  bool combine(epHandle_t handle, double* us);
  void checkDispatch(unsigned generation);
  void runExpert();
  void checkCombine();
  void firstPass();
  void timedPasses();

  int64_t capacity_;
  int64_t num_recv_ = -1, dispatch_capacity_ = 0;
  std::vector<double> dispatch_us_, combine_us_;
  // Rows this rank's tokens send across nodes: once per destination node
  // (the hierarchical algorithm), once per destination rank (a flat all-to-all).
  int num_nodes_ = 1;
  int64_t net_rows_hier_ = 0, net_rows_flat_ = 0;
  void countNetworkRows(const std::vector<int64_t>& idx);

  // Inputs: x and scales of generation 0 (timed) and 1 (the cached re-dispatch).
  DeviceBuffer x_[2], x_scales_[2], topk_idx_, topk_weights_;
  DeviceBuffer recv_x_, recv_scales_, recv_topk_idx_, recv_topk_weights_, recv_per_expert_, num_recv_dev_;
  DeviceBuffer y_, out_, out_topk_weights_;
};

ShapeRun::ShapeRun(const Options& opt, const Shape& shape, ControlChannel* ctl, BenchDevice* dev)
    : BenchRankRun(opt, shape, opt.type, ctl, dev) {
  // Every token of every rank could come here (each goes to a rank at most once).
  capacity_ = int64_t(spec_.nranks) * shape.tokens;
}

void ShapeRun::allocate() {
  const size_t H = size_t(spec_.hidden), K = size_t(spec_.topk), nb = size_t(spec_.scaleBlocks());
  const size_t T = size_t(T_), cap = size_t(capacity_);
  const bool fp8 = spec_.type == epFloat8E4M3;
  try {
    for (int g = 0; g < (opt_.check ? 2 : 1); g++) {
      x_[g] = DeviceBuffer(dev_, T * spec_.rowBytes());
      x_scales_[g] = DeviceBuffer(dev_, fp8 ? T * nb * sizeof(float) : 0);
    }
    topk_idx_ = DeviceBuffer(dev_, T * K * sizeof(int64_t));
    topk_weights_ = DeviceBuffer(dev_, T * K * sizeof(float));
    recv_x_ = DeviceBuffer(dev_, cap * spec_.rowBytes());
    recv_scales_ = DeviceBuffer(dev_, fp8 ? cap * nb * sizeof(float) : 0);
    recv_topk_idx_ = DeviceBuffer(dev_, cap * K * sizeof(int64_t));
    recv_topk_weights_ = DeviceBuffer(dev_, cap * K * sizeof(float));
    recv_per_expert_ = DeviceBuffer(dev_, size_t(spec_.localExperts()) * sizeof(int));
    num_recv_dev_ = DeviceBuffer(dev_, sizeof(int64_t));
    y_ = DeviceBuffer(dev_, cap * H * sizeof(uint16_t));
    out_ = DeviceBuffer(dev_, T * H * sizeof(uint16_t));
    out_topk_weights_ = DeviceBuffer(dev_, T * K * sizeof(float));
  } catch (const std::bad_alloc&) {
    fail("out of memory allocating the buffers of " + std::to_string(T_) + " tokens and " +
         std::to_string(capacity_) + " received rows");
  }
}

// Generates this rank's inputs on the host and moves them to the device.
void ShapeRun::fillInputs() {
  const size_t K = size_t(spec_.topk);
  std::vector<int64_t> idx(size_t(T_) * K);
  std::vector<float> w(size_t(T_) * K);
  for (int g = 0; g < (opt_.check ? 2 : 1); g++) {
    tools::RankInputs in(spec_, rank_, unsigned(g));
    std::vector<unsigned char> x(x_[g].bytes());
    std::vector<float> sc(x_scales_[g].bytes() / sizeof(float));
    in.fill(x.data(), sc.data(), g == 0 ? idx.data() : nullptr, g == 0 ? w.data() : nullptr);
    if (!x.empty()) dev_->upload(x_[g].get(), x.data(), x.size());
    if (!sc.empty()) dev_->upload(x_scales_[g].get(), sc.data(), sc.size() * sizeof(float));
  }
  if (!idx.empty()) dev_->upload(topk_idx_.get(), idx.data(), idx.size() * sizeof(int64_t));
  if (!w.empty()) dev_->upload(topk_weights_.get(), w.data(), w.size() * sizeof(float));
  countNetworkRows(idx);
}

// From the routing and the communicator's node map: each token's distinct
// destination nodes and ranks other than this rank's node.
void ShapeRun::countNetworkRows(const std::vector<int64_t>& idx) {
  int n = 0;
  std::vector<int> node_of(size_t(spec_.nranks), 0);
  if (epCommNodes(comm_, &n, node_of.data()) != epSuccess || n < 1) return;
  num_nodes_ = n;
  const size_t K = size_t(spec_.topk);
  const int mine = node_of[size_t(rank_)];
  std::vector<int> nodes, ranks;
  for (int t = 0; t < T_; t++) {
    nodes.clear();
    ranks.clear();
    for (size_t k = 0; k < K; k++) {
      const int64_t e = idx[size_t(t) * K + k];
      if (e < 0) continue;
      const int r = spec_.ownerOf(e);
      if (node_of[size_t(r)] == mine) continue;
      if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
      if (std::find(nodes.begin(), nodes.end(), node_of[size_t(r)]) == nodes.end()) nodes.push_back(node_of[size_t(r)]);
    }
    net_rows_hier_ += int64_t(nodes.size());
    net_rows_flat_ += int64_t(ranks.size());
  }
}

// Before a checked pass: outputs full of bytes the library would never write
// (bf16 0xffff is a NaN, 0x5555... is no expert id), so a skipped element shows.
void ShapeRun::poisonOutputs() {
  for (DeviceBuffer* b : {&recv_x_, &recv_scales_, &recv_topk_idx_, &recv_topk_weights_, &recv_per_expert_})
    if (b->bytes()) dev_->fill(b->get(), 0x55, b->bytes());
  for (DeviceBuffer* b : {&out_, &out_topk_weights_})
    if (b->bytes()) dev_->fill(b->get(), 0xff, b->bytes());
}

epDispatchArgs_t ShapeRun::dispatchArgs(unsigned generation) const {
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = x_[generation].get();
  a.x_type = spec_.type;
  a.x_scales = x_scales_[generation].as<float>();
  a.topk_idx = topk_idx_.get();
  a.topk_idx_type = epInt64;
  a.topk_weights = topk_weights_.as<float>();
  a.num_tokens = T_;
  a.num_topk = spec_.topk;
  a.recv_x = recv_x_.get();
  a.recv_scales = recv_scales_.as<float>();
  a.recv_topk_idx = recv_topk_idx_.as<int64_t>();
  a.recv_topk_weights = recv_topk_weights_.as<float>();
  a.recv_tokens_per_expert = recv_per_expert_.as<int>();
  return a;
}

// One dispatch of generation `generation` of x: new routing when *handle is
// NULL (the handle is returned), else a cached re-dispatch with *handle.
bool ShapeRun::dispatch(unsigned generation, epHandle_t* handle, double* us) {
  epDispatchArgs_t a = dispatchArgs(generation);
  const char* call = *handle != nullptr ? "epDispatch (cached re-dispatch)" : "epDispatch";
  int64_t num_recv = -1;
  epResult_t res;
  const auto start = Clock::now();
  if (opt_.exact) {
    // Exact sizing: the prepared (or cached) handle knows the row count.
    if (*handle == nullptr && (res = epDispatchPrepare(comm_, &a, handle, dev_->stream())) != epSuccess) {
      apiFail("epDispatchPrepare", res, comm_);
      return false;
    }
    if ((res = epHandleRecvCount(*handle, &a.recv_capacity)) != epSuccess) {
      apiFail("epHandleRecvCount", res, nullptr);
      return false;
    }
    a.num_recv = &num_recv;
  } else {
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.recv_capacity = capacity_;
    a.num_recv = num_recv_dev_.as<int64_t>();
  }
  res = epDispatch(comm_, &a, handle, dev_->stream());
  dev_->synchronize();
  if (us) *us = tools::elapsedUs(start);
  if (res != epSuccess) {
    apiFail(call, res, comm_);
    return false;
  }
  if (!opt_.exact) dev_->download(&num_recv, num_recv_dev_.get(), sizeof(num_recv));
  num_recv_ = num_recv;
  dispatch_capacity_ = a.recv_capacity;
  return true;
}

bool ShapeRun::combine(epHandle_t handle, double* us) {
  epCombineArgs_t a = EP_COMBINE_ARGS_INITIALIZER;
  a.flags = EP_COMBINE_DETERMINISTIC;  // the reference sums in ascending rank order
  a.y = y_.get();
  a.y_type = epBfloat16;
  a.recv_topk_weights = recv_topk_weights_.as<float>();
  a.num_topk = spec_.topk;
  a.out = out_.get();
  a.out_topk_weights = out_topk_weights_.as<float>();
  const auto start = Clock::now();
  epResult_t res = epCombine(comm_, &a, handle, dev_->stream());
  dev_->synchronize();
  if (us) *us = tools::elapsedUs(start);
  if (res != epSuccess) apiFail("epCombine", res, comm_);
  return res == epSuccess;
}

void ShapeRun::checkDispatch(unsigned generation) {
  const int64_t rows = std::max<int64_t>(0, std::min(num_recv_, dispatch_capacity_));
  const size_t K = size_t(spec_.topk), nb = size_t(spec_.scaleBlocks());
  const int64_t cap = dispatch_capacity_;
  std::vector<unsigned char> s0, s1, s2, s3, s4;
  tools::DispatchOutputs got;
  got.recv_x = dev_->hostView(recv_x_.get(), size_t(rows) * spec_.rowBytes(), &s0);
  if (recv_scales_.bytes())
    got.recv_scales =
        static_cast<const float*>(dev_->hostView(recv_scales_.get(), size_t(rows) * nb * 4, &s1));
  // Index rows are read up to the capacity: unused ones must say -1.
  got.recv_topk_idx =
      static_cast<const int64_t*>(dev_->hostView(recv_topk_idx_.get(), size_t(cap) * K * 8, &s2));
  got.recv_topk_weights =
      static_cast<const float*>(dev_->hostView(recv_topk_weights_.get(), size_t(rows) * K * 4, &s3));
  got.recv_tokens_per_expert =
      static_cast<const int*>(dev_->hostView(recv_per_expert_.get(), recv_per_expert_.bytes(), &s4));
  got.num_recv = num_recv_;
  got.capacity = cap;
  got.unused_rows_marked = !opt_.exact;
  tools::checkDispatch(spec_, rank_, generation, got, &log_);
}

// The expert: y row = received row * (1 + 0.25 rank), rounded to bf16.
void ShapeRun::runExpert() {
  const size_t H = size_t(spec_.hidden), nb = size_t(spec_.scaleBlocks()), rb = spec_.rowBytes();
  const int64_t rows = std::max<int64_t>(0, std::min(num_recv_, dispatch_capacity_));
  std::vector<unsigned char> s0, s1;
  const auto* recv = static_cast<const unsigned char*>(dev_->hostView(recv_x_.get(), size_t(rows) * rb, &s0));
  const float* scales =
      recv_scales_.bytes()
          ? static_cast<const float*>(dev_->hostView(recv_scales_.get(), size_t(rows) * nb * 4, &s1))
          : nullptr;
  std::vector<float> values(H);
  std::vector<uint16_t> y(H);
  for (int64_t r = 0; r < rows; r++) {
    tools::rowToValues(spec_, recv + size_t(r) * rb, scales ? scales + size_t(r) * nb : nullptr,
                       values.data());
    tools::expertRow(values.data(), spec_.hidden, rank_, y.data());
    dev_->upload(y_.as<uint16_t>() + size_t(r) * H, y.data(), H * sizeof(uint16_t));
  }
}

void ShapeRun::checkCombine() {
  std::vector<unsigned char> s0, s1;
  const auto* out = static_cast<const uint16_t*>(dev_->hostView(out_.get(), out_.bytes(), &s0));
  const auto* w =
      static_cast<const float*>(dev_->hostView(out_topk_weights_.get(), out_topk_weights_.bytes(), &s1));
  tools::checkCombine(spec_, rank_, out, w, &log_);
}

// Untimed: dispatch, expert, combine, and under --check the cached re-dispatch,
// each output checked. Its handle is the one the cached re-dispatch reuses.
void ShapeRun::firstPass() {
  if (opt_.check && ok()) poisonOutputs();
  epHandle_t handle = nullptr;
  barrier();
  bool dispatched = ok() && dispatch(0, &handle, nullptr);
  if (dispatched && opt_.check) checkDispatch(0);
  if (dispatched) runExpert();
  barrier();
  if (ok() && combine(handle, nullptr) && opt_.check) checkCombine();
  if (opt_.check) {
    // New rows along the same routes: the backward of combine.
    if (ok()) poisonOutputs();
    barrier();
    if (ok() && dispatch(1, &handle, nullptr)) checkDispatch(1);
  }
  epHandleDestroy(handle);
}

void ShapeRun::timedPasses() {
  for (int i = 0; i < opt_.warmup + opt_.iters; i++) {
    epHandle_t handle = nullptr;
    double d_us = 0, c_us = 0;
    barrier();
    bool dispatched = ok() && dispatch(0, &handle, &d_us);
    barrier();
    bool combined = dispatched && ok() && combine(handle, &c_us);
    epHandleDestroy(handle);
    if (combined && i >= opt_.warmup) {
      dispatch_us_.push_back(d_us);
      combine_us_.push_back(c_us);
    }
  }
}

RankReport ShapeRun::run(const epUniqueId& id) {
  initComm(id, config());
  if (ok()) allocate();
  if (ok()) fillInputs();
  firstPass();
  const int64_t first_rows = num_recv_;
  timedPasses();

  RankReport rep;
  fillStatus(&rep);
  rep.recv_rows = first_rows;
  rep.num_nodes = num_nodes_;
  rep.tokens = T_;
  rep.net_rows_hier = net_rows_hier_;
  rep.net_rows_flat = net_rows_flat_;
  if (first_rows >= 0) {
    const double scale_bytes = spec_.type == epFloat8E4M3 ? 4.0 * spec_.scaleBlocks() : 0.0;
    rep.dispatch_bytes = double(first_rows) * (double(spec_.rowBytes()) + scale_bytes);
    rep.combine_bytes = double(first_rows) * double(spec_.hidden) * sizeof(uint16_t);
  }
  rep.dispatch_us = tools::median(dispatch_us_);
  rep.combine_us = tools::median(combine_us_);
  return rep;
}

// ---- Results, on rank 0 ------------------------------------------------------

struct ShapeResult : tools::ShapeStatus {
  Shape shape;
  double recv_rows = -1;  // mean over ranks
  double dispatch_us = -1, combine_us = -1, dispatch_gbps = -1, combine_gbps = -1;
  // Across nodes: rows per token that cross the network, hierarchical and
  // flat, and the bytes of one row as dispatched (scales included).
  int num_nodes = 1;
  double net_rows_hier = 0, net_rows_flat = 0, row_bytes = 0;
};

ShapeResult summarize(const Shape& shape, const std::vector<RankReport>& reps) {
  ShapeResult res;
  res.shape = shape;
  double rows = 0, d_bytes = 0, c_bytes = 0;
  bool all_timed = true;
  int64_t tokens = 0, hier = 0, flat = 0;
  for (const RankReport& r : reps) {
    res.add(r);
    res.num_nodes = std::max(res.num_nodes, r.num_nodes);
    tokens += r.tokens;
    hier += r.net_rows_hier;
    flat += r.net_rows_flat;
    rows += double(r.recv_rows);
    d_bytes += r.dispatch_bytes;
    c_bytes += r.combine_bytes;
    all_timed = all_timed && r.dispatch_us >= 0 && r.combine_us >= 0 && r.recv_rows >= 0;
    res.dispatch_us = std::max(res.dispatch_us, r.dispatch_us);
    res.combine_us = std::max(res.combine_us, r.combine_us);
  }
  if (tokens > 0) {
    res.net_rows_hier = double(hier) / double(tokens);
    res.net_rows_flat = double(flat) / double(tokens);
  }
  if (!all_timed || reps.empty()) {
    res.dispatch_us = res.combine_us = -1;
    return res;
  }
  const double n = double(reps.size());
  res.recv_rows = rows / n;
  // GB/s = bytes / (us * 1e3).
  if (res.dispatch_us > 0) res.dispatch_gbps = d_bytes / n / (res.dispatch_us * 1e3);
  if (res.combine_us > 0) res.combine_gbps = c_bytes / n / (res.combine_us * 1e3);
  return res;
}

void printHeader(const Options& opt, const LaunchInfo& li, const char* backend) {
  tools::printBanner(li, backend);
  printf("# dispatch %s, combine bf16; sizing %s; warmup %d, iters %d; check %s; seed %" PRIu64 "%s\n",
         tools::typeName(opt.type),
         opt.exact ? "exact (epDispatchPrepare + epHandleRecvCount)"
                   : "capacity (ranks * tokens rows, EP_DISPATCH_NO_HOST_SYNC)",
         opt.warmup, opt.iters, opt.check ? "on (plus a cached re-dispatch)" : "off", opt.seed,
         opt.zero_rank0 ? "; rank 0 has no tokens" : "");
  printf(
      "# time: median of each rank's timed calls, largest over ranks (us); a barrier precedes each call\n");
  printf("# bw: logical (DeepEP): bytes of all rows a rank receives, own included / time, mean over ranks\n");
  printf("#\n");
  printf("%s %10s %12s %9s %12s %9s  %s\n", tools::shapeColumnNames("type").c_str(), "recv_rows",
         "dispatch_us", "GB/s", "combine_us", "GB/s", "check");
  fflush(stdout);
}

// Bytes of one dispatched row: the elements, and FP8's float scale per 128.
double dispatchRowBytes(const Options& opt, const Shape& s) {
  const bool fp8 = opt.type == epFloat8E4M3;
  return double(s.hidden) * (fp8 ? 1 : 2) + (fp8 ? 4.0 * double((s.hidden + 127) / 128) : 0.0);
}

void printResult(const Options& opt, const ShapeResult& r, int nranks, const char* backend) {
  const double row_bytes = dispatchRowBytes(opt, r.shape);
  if (opt.json) {
    printf(
        "{%s,\"nodes\":%d,\"net_bytes_per_token_hier\":%.1f,\"net_bytes_per_token_flat\":%.1f,"
        "\"sizing\":\"%s\",\"zero_rank0\":%s,\"warmup\":%d,\"iters\":%d,"
        "\"recv_rows\":%s,\"dispatch_us\":%s,\"dispatch_gbps\":%s,\"combine_us\":%s,"
        "\"combine_gbps\":%s,%s}\n",
        tools::jsonShape(r.shape, nranks, opt.type, backend).c_str(), r.num_nodes, r.net_rows_hier * row_bytes,
        r.net_rows_flat * row_bytes, opt.exact ? "exact" : "capacity",
        opt.zero_rank0 ? "true" : "false", opt.warmup, opt.iters, tools::jsonNumber(r.recv_rows, 1).c_str(),
        tools::jsonNumber(r.dispatch_us, 1).c_str(), tools::jsonNumber(r.dispatch_gbps, 3).c_str(),
        tools::jsonNumber(r.combine_us, 1).c_str(), tools::jsonNumber(r.combine_gbps, 3).c_str(),
        tools::jsonStatus(r).c_str());
  } else {
    printf("%s %10s %12s %9s %12s %9s  %s\n", tools::shapeColumns(r.shape, nranks, opt.type).c_str(),
           tools::number(r.recv_rows, 1).c_str(), tools::number(r.dispatch_us, 1).c_str(),
           tools::number(r.dispatch_gbps, 2).c_str(), tools::number(r.combine_us, 1).c_str(),
           tools::number(r.combine_gbps, 2).c_str(), tools::checkWord(r, "-"));
    if (r.num_nodes > 1)
      printf("#   network, %d nodes: per token %.2f rows cross it once per node (%.0f bytes), a flat all-to-all "
             "%.2f (%.0f bytes): %.2fx\n", r.num_nodes, r.net_rows_hier, r.net_rows_hier * row_bytes,
             r.net_rows_flat, r.net_rows_flat * row_bytes,
             r.net_rows_flat > 0 ? r.net_rows_hier / r.net_rows_flat : 0.0);
    tools::printStatusNotes(r);
  }
  fflush(stdout);
}

// ---- Driver ----------------------------------------------------------------

// The library's timeout when the options give none: EP_TIMEOUT_MS, else its default.
int libraryTimeoutMs(const Options& opt) {
  if (opt.timeout_ms > 0) return opt.timeout_ms;
  const char *name = nullptr, *def = nullptr, *value = nullptr;
  for (int i = 0; epGetParam(i, &name, &def, &value, nullptr) == epSuccess; i++)
    if (strcmp(name, "EP_TIMEOUT_MS") == 0) {
      long v = 0;
      if (value != nullptr && parseLong(value, 1, 1L << 30, &v)) return int(v);
      if (def != nullptr && parseLong(def, 1, 1L << 30, &v)) return int(v);
    }
  return 60000;
}

// Runs one shape on this rank; on rank 0 returns the result of all ranks
// (elsewhere: of this rank, enough for the exit status).
ShapeResult runShape(const Options& opt, const Shape& shape, ControlChannel* ctl, BenchDevice* dev) {
  return summarize(shape, tools::runOnRanks<RankReport>(ctl, [&](const epUniqueId& id) {
                     ShapeRun run(opt, shape, ctl, dev);
                     return run.run(id);
                   }));
}

int benchMain(const Options& opt, const LaunchInfo& li) {
  std::string error;
  std::unique_ptr<BenchDevice> dev = tools::makeBenchDevice(opt.backend, li.rank, &error);
  if (!dev) {
    fprintf(stderr, "ep_bench: rank %d: %s\n", li.rank, error.c_str());
    return 1;
  }
  // The control channel must outwait a bench call that times out on a peer.
  const int bench_timeout = libraryTimeoutMs(opt);
  const int ctl_timeout =
      int(std::min<int64_t>(INT32_MAX, std::max<int64_t>(2 * int64_t(bench_timeout) + 10000, 300000)));
  ControlChannel ctl;
  if (ctl.init(li.id, li.rank, li.nranks, ctl_timeout) != epSuccess) {
    fprintf(stderr, "ep_bench: rank %d: %s\n", li.rank, ctl.error().c_str());
    return 1;
  }
  launchJoined();  // every rank has the id: a launcher's id file can go
  const bool printer = li.rank == 0;
  const bool ll = opt.mode == BenchMode::kLowLatency;
  if (printer && !opt.json) {
    if (ll)
      tools::printLowLatencyHeader(opt, li, dev->name());
    else
      printHeader(opt, li, dev->name());
  }
  int failed = 0, skipped = 0;
  // Every shape through run (the shape on all ranks) and print (on rank 0),
  // whose result types differ by mode.
  auto runShapes = [&](auto run, auto print) {
    for (const Shape& shape : opt.shapes) {
      decltype(run(shape)) r;
      // Experts live in contiguous blocks of E/R per rank (the library's
      // placement, and the reference's): other counts cannot run. Every rank
      // decides alike, without talking.
      if (shape.experts % li.nranks != 0) {
        r.shape = shape;
        r.skipped = "experts " + std::to_string(shape.experts) + " is not a multiple of the " +
                    std::to_string(li.nranks) + " ranks (experts are placed in equal blocks)";
        skipped++;
      } else {
        r = run(shape);
        if (!r.passed()) failed++;
      }
      if (printer) print(r);
    }
  };
  try {
    if (ll)
      runShapes([&](const Shape& shape) { return tools::runLowLatencyShape(opt, shape, &ctl, dev.get()); },
                [&](const tools::LLShapeResult& r) {
                  tools::printLowLatencyResult(opt, r, li.nranks, dev->name());
                });
    else
      runShapes([&](const Shape& shape) { return runShape(opt, shape, &ctl, dev.get()); },
                [&](const ShapeResult& r) { printResult(opt, r, li.nranks, dev->name()); });
  } catch (const ControlFailure& e) {
    fprintf(stderr, "ep_bench: rank %d: %s\n", li.rank, e.what());
    return 1;
  }
  const int ran = int(opt.shapes.size()) - skipped;
  if (printer) {
    FILE* f = opt.json ? stderr : stdout;  // --json keeps stdout to JSON objects
    std::string note = skipped ? " (" + std::to_string(skipped) + " of " + std::to_string(opt.shapes.size()) +
                                     " shapes skipped)"
                               : "";
    if (ran == 0)
      fprintf(f, "# no shape could run with %d ranks\n", li.nranks);
    else if (failed == 0)
      fprintf(f, "# all %s%s\n", opt.check ? "checks passed" : "shapes ran (unchecked)", note.c_str());
    else
      fprintf(f, "# %d %s failed%s\n", failed, opt.check ? "checks" : "shapes", note.c_str());
  }
  fflush(stdout);
  return failed == 0 && ran > 0 ? 0 : 1;
}

}  // namespace

// --backend cuda: the GPU benchmark is its own program (built with nvcc when
// the library has CUDA: ep_bench_gpu beside this one); hand it the other
// arguments (spelled[i]: argument i was the --backend option). Returns only
// when it cannot be started: -1 when there is no such program (a build
// without CUDA, where the option parser says so), else 2.
int runGpuBench(int argc, char** argv, const std::vector<char>& spelled) {
  std::vector<char*> args;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = '\0';
    dir = std::string(self);
    dir = dir.substr(0, dir.rfind('/'));
  }
  std::string gpu = dir + "/ep_bench_gpu";
  if (access(gpu.c_str(), X_OK) != 0) return -1;
  args.push_back(const_cast<char*>(gpu.c_str()));
  for (int i = 1; i < argc; i++)
    if (!spelled[size_t(i)]) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(gpu.c_str(), args.data());
  fprintf(stderr, "ep_bench: --backend cuda needs %s (built by make when nvcc is present): %s\n", gpu.c_str(),
          strerror(errno));
  return 2;
}

int main(int argc, char** argv) {
  std::vector<char> backend_args;
  if (backendOption(argc, argv, &backend_args) == "cuda") {
    const int rc = runGpuBench(argc, argv, backend_args);
    if (rc >= 0) return rc;
  }
  Options opt;
  std::string error;
  switch (parseOptions(argc, argv, &opt, &error)) {
    case kParsed:
      break;
    case kHelp:
      if (tools::launcherRank() <= 0) usage(stdout);
      return 0;
    case kBadOptions:
      if (tools::launcherRank() <= 0) {  // under mpirun, say it once
        fprintf(stderr, "ep_bench: %s\n", error.c_str());
        usage(stderr);
      }
      return 2;
  }
  LaunchInfo li;
  if (launchRanks(opt.nranks, 0, &li) != 0) return 1;
  return benchMain(opt, li);
}
