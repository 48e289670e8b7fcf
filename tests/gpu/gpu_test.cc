// GPU tests of the CUDA backend: every output element of layout, dispatch
// (exact and capacity sizing, cached re-dispatch) and combine compared with the
// host backend run on the same random inputs (bit for bit), CUDA graph capture
// and replay with new data. Ranks are threads of this process (epCommInitAll).
//   gpu_test            all cases
//   gpu_test --small    small cases only (for compute-sanitizer)
// Prints SKIPPED and exits 0 when no GPU is visible (tests/gpu/run.sh turns
// that into a failure of `make gpu-test`).
#include <algorithm>
#include <string>

#include "gpu_common.h"

namespace {

struct Case {
  std::string name;
  int R, H, K, E;
  std::vector<int> T;  // tokens per rank
  epDataType_t dt = epBfloat16, ct = epBfloat16;
  int align = 0;
  double neg = 0;
  bool idx32 = false, weights = true, bias = false, transposed_scales = false;
  int num_sms = 0;
};

struct RankIn {
  std::vector<uint8_t> x, x2, bias, y;
  std::vector<float> scales, w;
  std::vector<int64_t> topk;
  std::vector<int32_t> topk32;
};

struct RankOut {
  int64_t num_recv = -1;
  std::vector<uint8_t> recv_x, recv_x2, out;
  std::vector<float> scales, w, out_w;
  std::vector<int64_t> idx;
  std::vector<int> tpe;
  std::vector<int> tpr, tpn, tpexp;
  std::vector<uint8_t> in_rank;
};

struct Geometry {
  int maxT, cap, nb, EL;
  size_t drow, crow, s_tok, s_blk;
};

Geometry geometryOf(const Case& c) {
  Geometry g;
  g.maxT = *std::max_element(c.T.begin(), c.T.end());
  g.cap = g.maxT * c.R;
  g.nb = c.dt == epFloat8E4M3 ? (c.H + 127) / 128 : 0;
  g.EL = c.E / c.R;
  g.drow = size_t(c.H) * typeSize(c.dt);
  g.crow = size_t(c.H) * typeSize(c.ct);
  g.s_tok = c.transposed_scales ? 1 : size_t(g.nb);
  g.s_blk = c.transposed_scales ? size_t(g.maxT) : 1;
  return g;
}

epConfig_t configOf(const Case& c, epBackend_t b) {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = c.E;
  cfg.hidden = c.H;
  cfg.max_tokens_per_rank = geometryOf(c).maxT;
  cfg.max_topk = c.K;
  cfg.dispatch_type = c.dt;
  cfg.combine_type = c.ct;
  cfg.backend = b;
  cfg.timeout_ms = 20000;
  cfg.num_sms = c.num_sms;
  return cfg;
}

void makeInputs(const Case& c, uint64_t seed, std::vector<RankIn>* ins) {
  const Geometry g = geometryOf(c);
  ins->resize(c.R);
  for (int r = 0; r < c.R; r++) {
    std::mt19937_64 gen(seed * 1000 + r);
    RankIn& in = (*ins)[r];
    const int T = c.T[r];
    in.x.resize(std::max<size_t>(1, T * g.drow));
    in.x2.resize(in.x.size());
    fillRandomRow(gen, c.dt, in.x.data(), size_t(T) * c.H);
    fillRandomRow(gen, c.dt, in.x2.data(), size_t(T) * c.H);
    in.scales.assign(std::max<size_t>(1, size_t(g.maxT) * std::max(g.nb, 1)), 0.f);
    std::uniform_real_distribution<float> u(0.001f, 4.0f);
    for (auto& s : in.scales) s = u(gen);
    randomTopk(gen, T, c.K, c.E, c.neg, &in.topk);
    in.topk32.assign(in.topk.begin(), in.topk.end());
    in.w.resize(std::max<size_t>(1, size_t(T) * c.K));
    for (auto& w : in.w) w = u(gen);
    in.bias.resize(std::max<size_t>(1, T * g.crow));
    fillRandomRow(gen, c.ct, in.bias.data(), size_t(T) * c.H);
    in.y.resize(size_t(g.cap) * g.crow);
    fillRandomRow(gen, c.ct, in.y.data(), size_t(g.cap) * c.H);
  }
}

epDispatchArgs_t dispatchArgs(const Case& c, const RankIn& in, int r, const void* x, const float* scales,
                              const void* topk, const float* w) {
  const Geometry g = geometryOf(c);
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = x;
  a.x_type = c.dt;
  a.x_scales = g.nb ? scales : nullptr;
  a.scales_token_stride = g.s_tok;
  a.scales_block_stride = g.s_blk;
  a.topk_idx = topk;
  a.topk_idx_type = c.idx32 ? epInt32 : epInt64;
  a.topk_weights = c.weights ? w : nullptr;
  a.num_tokens = c.T[r];
  a.num_topk = c.K;
  a.expert_alignment = c.align;
  a.recv_capacity = g.cap;
  (void)in;
  return a;
}

// The reference: the host backend.
void runHost(const Case& c, epComm_t* comms, const std::vector<RankIn>& ins, std::vector<RankOut>* outs) {
  const Geometry g = geometryOf(c);
  outs->assign(c.R, RankOut());
  runRanks(c.R, [&](int r) {
    const RankIn& in = ins[r];
    RankOut& o = (*outs)[r];
    const void* topk = c.idx32 ? (const void*)in.topk32.data() : (const void*)in.topk.data();
    o.tpr.assign(c.R, 0);
    o.tpn.assign(c.R, 0);
    o.tpexp.assign(c.E, 0);
    o.in_rank.assign(std::max<size_t>(1, size_t(c.T[r]) * c.R), 0);
    epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
    la.topk_idx = topk;
    la.topk_idx_type = c.idx32 ? epInt32 : epInt64;
    la.num_tokens = c.T[r];
    la.num_topk = c.K;
    la.tokens_per_rank = o.tpr.data();
    la.tokens_per_node = o.tpn.data();
    la.tokens_per_expert = o.tpexp.data();
    la.is_token_in_rank = o.in_rank.data();
    EK(comms[r], epLayout(comms[r], &la, nullptr));
    o.recv_x.assign(size_t(g.cap) * g.drow, 0);
    o.recv_x2.assign(size_t(g.cap) * g.drow, 0);
    o.scales.assign(std::max<size_t>(1, size_t(g.cap) * g.nb), 0);
    o.idx.assign(size_t(g.cap) * c.K, 0);
    o.w.assign(size_t(g.cap) * c.K, 0);
    o.tpe.assign(g.EL, 0);
    o.out.assign(std::max<size_t>(1, c.T[r] * g.crow), 0);
    o.out_w.assign(std::max<size_t>(1, size_t(c.T[r]) * c.K), 0);
    epDispatchArgs_t a = dispatchArgs(c, in, r, in.x.data(), in.scales.data(), topk, in.w.data());
    a.recv_x = o.recv_x.data();
    a.recv_scales = g.nb ? o.scales.data() : nullptr;
    a.recv_topk_idx = o.idx.data();
    a.recv_topk_weights = c.weights ? o.w.data() : nullptr;
    a.recv_tokens_per_expert = o.tpe.data();
    a.num_recv = &o.num_recv;
    epHandle_t h = nullptr;
    EK(comms[r], epDispatch(comms[r], &a, &h, nullptr));
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = in.y.data();
    ca.y_type = c.ct;
    ca.recv_topk_weights = c.weights ? o.w.data() : nullptr;
    ca.num_topk = c.K;
    ca.bias = c.bias ? in.bias.data() : nullptr;
    ca.out = o.out.data();
    ca.out_topk_weights = c.weights ? o.out_w.data() : nullptr;
    EK(comms[r], epCombine(comms[r], &ca, h, nullptr));
    a.x = in.x2.data();
    a.recv_x = o.recv_x2.data();
    EK(comms[r], epDispatch(comms[r], &a, &h, nullptr));
    epHandleDestroy(h);
  });
}

int g_failures = 0;

bool same(const char* what, const std::string& cname, int r, const void* gpu, const void* host, size_t bytes,
          size_t elem) {
  if (bytes == 0 || memcmp(gpu, host, bytes) == 0) return true;
  const uint8_t* a = static_cast<const uint8_t*>(gpu);
  const uint8_t* b = static_cast<const uint8_t*>(host);
  size_t i = 0;
  while (a[i] == b[i]) i++;
  size_t n = 0;
  for (size_t j = 0; j < bytes; j++) n += a[j] != b[j];
  printf("  FAIL %s rank %d %s: %zu bytes differ, first at element %zu (gpu 0x", cname.c_str(), r, what, n, i / elem);
  for (size_t k = 0; k < elem; k++) printf("%02x", a[i / elem * elem + elem - 1 - k]);
  printf(" host 0x");
  for (size_t k = 0; k < elem; k++) printf("%02x", b[i / elem * elem + elem - 1 - k]);
  printf(")\n");
  g_failures++;
  return false;
}

struct DevBufs {
  void *x, *x2, *topk, *recv_x, *recv_x2, *y, *bias, *out, *in_rank;
  float *scales, *w, *recv_scales, *recv_w, *out_w;
  int64_t *recv_idx, *num_recv;
  int *tpe, *tpr, *tpn, *tpexp;
};

void allocDev(const Case& c, const RankIn& in, int r, DevBufs* d) {
  const Geometry g = geometryOf(c);
  const int T = c.T[r];
  auto m = [](void** p, size_t n) { CK(cudaMalloc(p, std::max<size_t>(n, 16))); };
  m(&d->x, in.x.size());
  m(&d->x2, in.x2.size());
  m((void**)&d->scales, in.scales.size() * 4);
  m(&d->topk, in.topk.size() * 8);
  m((void**)&d->w, in.w.size() * 4);
  m(&d->recv_x, size_t(g.cap) * g.drow);
  m(&d->recv_x2, size_t(g.cap) * g.drow);
  m((void**)&d->recv_scales, size_t(g.cap) * g.nb * 4);
  m((void**)&d->recv_idx, size_t(g.cap) * c.K * 8);
  m((void**)&d->recv_w, size_t(g.cap) * c.K * 4);
  m((void**)&d->tpe, size_t(g.EL) * 4);
  m((void**)&d->num_recv, 8);
  m(&d->y, in.y.size());
  m(&d->bias, in.bias.size());
  m(&d->out, size_t(T) * g.crow);
  m((void**)&d->out_w, size_t(T) * c.K * 4);
  m((void**)&d->tpr, c.R * 4);
  m((void**)&d->tpn, c.R * 4);
  m((void**)&d->tpexp, c.E * 4);
  m(&d->in_rank, size_t(T) * c.R);
}

void uploadInputs(const Case& c, const RankIn& in, DevBufs* d, cudaStream_t s) {
  CK(cudaMemcpyAsync(d->x, in.x.data(), in.x.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->x2, in.x2.data(), in.x2.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->scales, in.scales.data(), in.scales.size() * 4, cudaMemcpyHostToDevice, s));
  if (c.idx32) CK(cudaMemcpyAsync(d->topk, in.topk32.data(), in.topk32.size() * 4, cudaMemcpyHostToDevice, s));
  else CK(cudaMemcpyAsync(d->topk, in.topk.data(), in.topk.size() * 8, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->w, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->y, in.y.data(), in.y.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->bias, in.bias.data(), in.bias.size(), cudaMemcpyHostToDevice, s));
}

void poison(const Case& c, int r, DevBufs* d, cudaStream_t s) {
  const Geometry g = geometryOf(c);
  const int T = c.T[r];
  CK(cudaMemsetAsync(d->recv_x, 0xa5, size_t(g.cap) * g.drow, s));
  CK(cudaMemsetAsync(d->recv_x2, 0xa5, size_t(g.cap) * g.drow, s));
  CK(cudaMemsetAsync(d->recv_scales, 0xa5, size_t(g.cap) * g.nb * 4, s));
  CK(cudaMemsetAsync(d->recv_idx, 0xa5, size_t(g.cap) * c.K * 8, s));
  CK(cudaMemsetAsync(d->recv_w, 0xa5, size_t(g.cap) * c.K * 4, s));
  CK(cudaMemsetAsync(d->tpe, 0xa5, size_t(g.EL) * 4, s));
  CK(cudaMemsetAsync(d->num_recv, 0xa5, 8, s));
  CK(cudaMemsetAsync(d->out, 0xa5, size_t(T) * g.crow, s));
  CK(cudaMemsetAsync(d->out_w, 0xa5, size_t(T) * c.K * 4, s));
  CK(cudaMemsetAsync(d->tpr, 0xa5, c.R * 4, s));
  CK(cudaMemsetAsync(d->tpn, 0xa5, c.R * 4, s));
  CK(cudaMemsetAsync(d->tpexp, 0xa5, c.E * 4, s));
  CK(cudaMemsetAsync(d->in_rank, 0xa5, size_t(T) * c.R, s));
}

void freeDev(DevBufs* d) {
  void* all[] = {d->x, d->x2, d->topk, d->recv_x, d->recv_x2, d->y, d->bias, d->out, d->in_rank, d->scales,
                 d->w, d->recv_scales, d->recv_w, d->out_w, d->recv_idx, d->num_recv, d->tpe, d->tpr,
                 d->tpn, d->tpexp};
  for (void* p : all) cudaFree(p);
}

template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(std::max<size_t>(n, 1));
  CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Dispatch + combine + cached dispatch on the GPU, compared with the reference.
void runGpuCase(const Case& c, epComm_t* comms, const std::vector<RankIn>& ins, const std::vector<RankOut>& ref,
                bool capacity) {
  const Geometry g = geometryOf(c);
  const std::string cname = c.name + (capacity ? " [capacity]" : " [exact]");
  std::vector<RankOut> got(c.R);
  runRanks(c.R, [&](int r) {
    CK(cudaSetDevice(r));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    DevBufs d;
    allocDev(c, ins[r], r, &d);
    uploadInputs(c, ins[r], &d, s);
    poison(c, r, &d, s);
    epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
    la.topk_idx = d.topk;
    la.topk_idx_type = c.idx32 ? epInt32 : epInt64;
    la.num_tokens = c.T[r];
    la.num_topk = c.K;
    la.tokens_per_rank = d.tpr;
    la.tokens_per_node = d.tpn;
    la.tokens_per_expert = d.tpexp;
    la.is_token_in_rank = (uint8_t*)d.in_rank;
    EK(comms[r], epLayout(comms[r], &la, s));
    epDispatchArgs_t a = dispatchArgs(c, ins[r], r, d.x, d.scales, d.topk, d.w);
    a.recv_x = d.recv_x;
    a.recv_scales = g.nb ? d.recv_scales : nullptr;
    a.recv_topk_idx = d.recv_idx;
    a.recv_topk_weights = c.weights ? d.recv_w : nullptr;
    a.recv_tokens_per_expert = d.tpe;
    int64_t host_num_recv = -1;
    if (capacity) {
      a.flags = EP_DISPATCH_NO_HOST_SYNC;
      a.num_recv = d.num_recv;
    } else {
      a.num_recv = &host_num_recv;
    }
    epHandle_t h = nullptr;
    EK(comms[r], epDispatch(comms[r], &a, &h, s));
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = d.y;
    ca.y_type = c.ct;
    ca.recv_topk_weights = c.weights ? d.recv_w : nullptr;
    ca.num_topk = c.K;
    ca.bias = c.bias ? d.bias : nullptr;
    ca.out = d.out;
    ca.out_topk_weights = c.weights ? d.out_w : nullptr;
    EK(comms[r], epCombine(comms[r], &ca, h, s));
    a.x = d.x2;
    a.recv_x = d.recv_x2;
    EK(comms[r], epDispatch(comms[r], &a, &h, s));
    CK(cudaStreamSynchronize(s));
    RankOut& o = got[r];
    o.num_recv = capacity ? download<int64_t>(d.num_recv, 1)[0] : host_num_recv;
    const int T = c.T[r];
    o.recv_x = download<uint8_t>(d.recv_x, size_t(g.cap) * g.drow);
    o.recv_x2 = download<uint8_t>(d.recv_x2, size_t(g.cap) * g.drow);
    o.scales = download<float>(d.recv_scales, size_t(g.cap) * g.nb);
    o.idx = download<int64_t>(d.recv_idx, size_t(g.cap) * c.K);
    o.w = download<float>(d.recv_w, size_t(g.cap) * c.K);
    o.tpe = download<int>(d.tpe, g.EL);
    o.out = download<uint8_t>(d.out, size_t(T) * g.crow);
    o.out_w = download<float>(d.out_w, size_t(T) * c.K);
    o.tpr = download<int>(d.tpr, c.R);
    o.tpn = download<int>(d.tpn, c.R);
    o.tpexp = download<int>(d.tpexp, c.E);
    o.in_rank = download<uint8_t>(d.in_rank, size_t(T) * c.R);
    EK(comms[r], epHandleDestroy(h));
    freeDev(&d);
    CK(cudaStreamDestroy(s));
  });
  int before = g_failures;
  for (int r = 0; r < c.R; r++) {
    const RankOut& o = got[r];
    const RankOut& e = ref[r];
    const int T = c.T[r];
    if (o.num_recv != e.num_recv) {
      printf("  FAIL %s rank %d num_recv gpu %lld host %lld\n", cname.c_str(), r, (long long)o.num_recv,
             (long long)e.num_recv);
      g_failures++;
      continue;
    }
    const size_t n = size_t(e.num_recv);
    int nnodes = 1;  // one node
    same("layout tokens_per_rank", cname, r, o.tpr.data(), e.tpr.data(), c.R * 4, 4);
    same("layout tokens_per_node", cname, r, o.tpn.data(), e.tpn.data(), nnodes * 4, 4);
    same("layout tokens_per_expert", cname, r, o.tpexp.data(), e.tpexp.data(), c.E * 4, 4);
    same("layout is_token_in_rank", cname, r, o.in_rank.data(), e.in_rank.data(), size_t(T) * c.R, 1);
    same("recv_x", cname, r, o.recv_x.data(), e.recv_x.data(), n * g.drow, std::min<size_t>(typeSize(c.dt), 4));
    same("recv_scales", cname, r, o.scales.data(), e.scales.data(), n * g.nb * 4, 4);
    same("recv_topk_idx", cname, r, o.idx.data(), e.idx.data(), n * c.K * 8, 8);
    if (c.weights) same("recv_topk_weights", cname, r, o.w.data(), e.w.data(), n * c.K * 4, 4);
    same("recv_tokens_per_expert", cname, r, o.tpe.data(), e.tpe.data(), g.EL * 4, 4);
    same("combine out", cname, r, o.out.data(), e.out.data(), T * g.crow, typeSize(c.ct));
    if (c.weights) same("combine out_topk_weights", cname, r, o.out_w.data(), e.out_w.data(), size_t(T) * c.K * 4, 4);
    same("cached recv_x", cname, r, o.recv_x2.data(), e.recv_x2.data(), n * g.drow, std::min<size_t>(typeSize(c.dt), 4));
    if (capacity) {
      std::vector<int64_t> minus(size_t(g.cap - n) * c.K, -1);
      same("unused rows recv_topk_idx = -1", cname, r, o.idx.data() + n * c.K, minus.data(), minus.size() * 8, 8);
    }
  }
  printf("%s %s (R=%d H=%d K=%d E=%d T=%d..)\n", g_failures == before ? "PASS" : "FAIL", cname.c_str(), c.R, c.H,
         c.K, c.E, c.T[0]);
  fflush(stdout);
}

// Dispatch (NO_HOST_SYNC) + combine captured in one CUDA graph per rank,
// replayed with new data each time.
void runGraphCase(const Case& c, epComm_t* gpu, epComm_t* host) {
  const Geometry g = geometryOf(c);
  const std::string cname = c.name + " [graph]";
  std::vector<DevBufs> d(c.R);
  std::vector<cudaStream_t> streams(c.R);
  std::vector<cudaGraphExec_t> execs(c.R);
  std::vector<epHandle_t> handles(c.R, nullptr);
  std::vector<RankIn> ins;
  makeInputs(c, 777, &ins);
  runRanks(c.R, [&](int r) {
    CK(cudaSetDevice(r));
    CK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    allocDev(c, ins[r], r, &d[r]);
    cudaStream_t s = streams[r];
    epDispatchArgs_t a = dispatchArgs(c, ins[r], r, d[r].x, d[r].scales, d[r].topk, d[r].w);
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.recv_x = d[r].recv_x;
    a.recv_scales = g.nb ? d[r].recv_scales : nullptr;
    a.recv_topk_idx = d[r].recv_idx;
    a.recv_topk_weights = c.weights ? d[r].recv_w : nullptr;
    a.recv_tokens_per_expert = d[r].tpe;
    a.num_recv = d[r].num_recv;
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = d[r].y;
    ca.y_type = c.ct;
    ca.recv_topk_weights = c.weights ? d[r].recv_w : nullptr;
    ca.num_topk = c.K;
    ca.bias = c.bias ? d[r].bias : nullptr;
    ca.out = d[r].out;
    ca.out_topk_weights = c.weights ? d[r].out_w : nullptr;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    EK(gpu[r], epDispatch(gpu[r], &a, &handles[r], s));
    EK(gpu[r], epCombine(gpu[r], &ca, handles[r], s));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&execs[r], graph, 0));
    CK(cudaGraphDestroy(graph));
  });
  for (int rep = 0; rep < 3; rep++) {
    makeInputs(c, 1000 + rep, &ins);
    std::vector<RankOut> ref;
    runHost(c, host, ins, &ref);
    std::vector<RankOut> got(c.R);
    runRanks(c.R, [&](int r) {
      CK(cudaSetDevice(r));
      cudaStream_t s = streams[r];
      uploadInputs(c, ins[r], &d[r], s);
      poison(c, r, &d[r], s);
      CK(cudaGraphLaunch(execs[r], s));
      CK(cudaStreamSynchronize(s));
      RankOut& o = got[r];
      o.num_recv = download<int64_t>(d[r].num_recv, 1)[0];
      o.recv_x = download<uint8_t>(d[r].recv_x, size_t(g.cap) * g.drow);
      o.idx = download<int64_t>(d[r].recv_idx, size_t(g.cap) * c.K);
      o.w = download<float>(d[r].recv_w, size_t(g.cap) * c.K);
      o.tpe = download<int>(d[r].tpe, g.EL);
      o.out = download<uint8_t>(d[r].out, size_t(c.T[r]) * g.crow);
      o.out_w = download<float>(d[r].out_w, size_t(c.T[r]) * c.K);
    });
    int before = g_failures;
    for (int r = 0; r < c.R; r++) {
      const RankOut& o = got[r];
      const RankOut& e = ref[r];
      if (o.num_recv != e.num_recv) {
        printf("  FAIL %s rank %d replay %d num_recv gpu %lld host %lld\n", cname.c_str(), r, rep,
               (long long)o.num_recv, (long long)e.num_recv);
        g_failures++;
        continue;
      }
      const size_t n = size_t(e.num_recv);
      same("recv_x", cname, r, o.recv_x.data(), e.recv_x.data(), n * g.drow, 2);
      same("recv_topk_idx", cname, r, o.idx.data(), e.idx.data(), n * c.K * 8, 8);
      std::vector<int64_t> minus(size_t(g.cap - n) * c.K, -1);
      same("unused rows", cname, r, o.idx.data() + n * c.K, minus.data(), minus.size() * 8, 8);
      if (c.weights) same("recv_topk_weights", cname, r, o.w.data(), e.w.data(), n * c.K * 4, 4);
      same("recv_tokens_per_expert", cname, r, o.tpe.data(), e.tpe.data(), g.EL * 4, 4);
      same("combine out", cname, r, o.out.data(), e.out.data(), c.T[r] * g.crow, 2);
      if (c.weights) same("out_topk_weights", cname, r, o.out_w.data(), e.out_w.data(), size_t(c.T[r]) * c.K * 4, 4);
    }
    printf("%s %s replay %d\n", g_failures == before ? "PASS" : "FAIL", cname.c_str(), rep);
    fflush(stdout);
  }
  runRanks(c.R, [&](int r) {
    CK(cudaSetDevice(r));
    epHandleDestroy(handles[r]);
    CK(cudaGraphExecDestroy(execs[r]));
    freeDev(&d[r]);
    CK(cudaStreamDestroy(streams[r]));
  });
}

void runCase(const Case& c, int ndev, bool graph) {
  if (c.R > ndev) {
    printf("SKIPPED %s: needs %d GPUs, %d visible\n", c.name.c_str(), c.R, ndev);
    return;
  }
  std::vector<epComm_t> gpu(c.R), host(c.R);
  epConfig_t gc = configOf(c, epBackendCuda), hc = configOf(c, epBackendHost);
  EK(nullptr, epCommInitAll(gpu.data(), c.R, nullptr, &gc));
  EK(nullptr, epCommInitAll(host.data(), c.R, nullptr, &hc));
  std::vector<RankIn> ins;
  makeInputs(c, 42, &ins);
  std::vector<RankOut> ref;
  runHost(c, host.data(), ins, &ref);
  runGpuCase(c, gpu.data(), ins, ref, false);
  runGpuCase(c, gpu.data(), ins, ref, true);
  if (graph) runGraphCase(c, gpu.data(), host.data());
  for (int r = 0; r < c.R; r++) {
    epCommDestroy(gpu[r]);
    epCommDestroy(host[r]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool small = argc > 1 && std::string(argv[1]) == "--small";
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIPPED gpu_test: no GPU visible (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  ndev = std::min(ndev, 8);
  // Under compute-sanitizer kernels of different GPUs may not run at once: one rank only.
  if (small) ndev = 1;
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  for (int R : {1, 2}) {
    std::string ep = "EP" + std::to_string(R) + " ";
    Case c;
    c = Case{ep + "bf16 h16 k1", R, 16, 1, 8, std::vector<int>(R, 37)};
    add(c);
    c = Case{ep + "bf16 h24 k9 neg", R, 24, 9, 18, std::vector<int>(R, 100)};
    c.neg = 0.3;
    c.bias = true;
    c.align = 4;
    if (R == 2) c.T[1] = 0;  // a rank with no tokens
    add(c);
    c = Case{ep + "fp8 h1040 k4 transposed scales idx32", R, 1040, 4, 16, std::vector<int>(R, 64)};
    c.dt = epFloat8E4M3;
    c.transposed_scales = true;
    c.idx32 = true;
    add(c);
    if (small) continue;
    c = Case{ep + "bf16 h1000 k32", R, 1000, 32, 64, std::vector<int>(R, 300)};
    c.neg = 0.1;
    c.bias = true;
    add(c);
    c = Case{ep + "fp16 h256", R, 256, 8, 32, std::vector<int>(R, 500)};
    c.dt = epFloat16;
    c.ct = epFloat16;
    c.bias = true;
    add(c);
    c = Case{ep + "fp32 h128", R, 128, 6, 32, std::vector<int>(R, 333)};
    c.dt = epFloat32;
    c.ct = epFloat32;
    c.bias = true;
    add(c);
    c = Case{ep + "bf16 h2560 k6 e64", R, 2560, 6, 64, std::vector<int>(R, 1000)};
    c.align = 128;
    add(c);
    c = Case{ep + "fp8 h7168 k8 e256", R, 7168, 8, 256, std::vector<int>(R, 1024)};
    c.dt = epFloat8E4M3;
    add(c);
    c = Case{ep + "bf16 h7168 k8 e256", R, 7168, 8, 256, std::vector<int>(R, 4096)};
    add(c);
  }
  for (const Case& c : cases) runCase(c, ndev, false);
  // Graph capture, EP2 (or EP1 on one GPU).
  {
    int R = std::min(ndev, 2);
    Case c{"EP" + std::to_string(R) + " bf16 h2560 k6 e64", R, 2560, 6, 64, std::vector<int>(R, small ? 64 : 1000)};
    c.bias = true;
    runCase(c, ndev, true);
  }
  printf("%s: %d failures\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
  return g_failures ? 1 : 0;
}
