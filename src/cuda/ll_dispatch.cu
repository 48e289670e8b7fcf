// Low-latency dispatch kernels and their launches (device code in
// ll_dispatch.cuh; small calls' send half: ll_dispatch_small.cu).
#include "ll_dispatch.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {

namespace {

template <bool kSingles>
__global__ void __launch_bounds__(kThreads, 1) llDispatchSendKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = llEnter(p.v, &p.v.local->pairs, kLLKindDispatch);
  dispatchSendPhase<kSingles>(p, pair);
  llTimeEnd(p.v, pair, kLLKindDispatch);
}

template <bool kFlagSources>
__global__ void __launch_bounds__(kThreads, 1) llDispatchRecvKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = llEnter(p.v, &p.hd->pair, kLLKindDispatchRecv);
  dispatchRecvPhase<kFlagSources>(p, pair, kLLKindDispatchRecv);
  llTimeEnd(p.v, pair, kLLKindDispatchRecv);
}

// Both halves in one launch (a call that is not split): every block sends its
// share, then receives. The grid is at most one block per SM so that all
// blocks are resident: blocks waiting in the receive half never keep a
// sending block from running.
// kFlagSources: as dispatchRecvPhase's.
template <bool kSingles, bool kFlagSources>
__global__ void __launch_bounds__(kThreads, 1) llDispatchKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = llEnter(p.v, &p.v.local->pairs, kLLKindDispatch);
  dispatchSendPhase<kSingles>(p, pair);
  dispatchRecvPhase<kFlagSources>(p, pair, kLLKindDispatch);
  llTimeEnd(p.v, pair, kLLKindDispatch);
}

}  // namespace

namespace EP_LL_VARIANT {

// Small calls (tokens at most a quarter of the grid: at least two row blocks
// per token) send through the row-slice kernels unless EP_CUDA_LL_SLICES
// says otherwise (`slices`: -1 auto, 0 never, 1 always); calls sending
// flagged records always do (only those kernels send them). Either kernel is
// correct for any other call; this only picks the faster.
static bool useSlices(const LLDispatchParams& p, const LLLaunch& l) {
  return p.flagged || l.slices > 0 || (l.slices < 0 && 4 * p.num_tokens <= llGrid(l.sms));
}

int launchLLDispatchSend(const LLDispatchParams& p, const LLLaunch& l) {
  if (useSlices(p, l)) return launchLLDispatchSlices(p, l, true);
  return llUsesSingles(p.v) ? llLaunch(llDispatchSendKernel<true>, p, kThreads, l)
                            : llLaunch(llDispatchSendKernel<false>, p, kThreads, l);
}

int launchLLDispatch(const LLDispatchParams& p, const LLLaunch& l) {
  if (useSlices(p, l)) return launchLLDispatchSlices(p, l, false);
  if (p.flag_cap)
    return llUsesSingles(p.v) ? llLaunch(llDispatchKernel<true, true>, p, kThreads, l)
                              : llLaunch(llDispatchKernel<false, true>, p, kThreads, l);
  return llUsesSingles(p.v) ? llLaunch(llDispatchKernel<true, false>, p, kThreads, l)
                            : llLaunch(llDispatchKernel<false, false>, p, kThreads, l);
}

// The receive half of a call whose send took the row slices: the receive
// slices where the records are few (decided in the kernel).
int launchLLDispatchRecv(const LLDispatchParams& p, const LLLaunch& l) {
  if (useSlices(p, l)) return launchLLDispatchRecvSlices(p, l);
  return p.flag_cap ? llLaunch(llDispatchRecvKernel<true>, p, kThreads, l)
                        : llLaunch(llDispatchRecvKernel<false>, p, kThreads, l);
}

int preloadLLDispatchKernels() {
  return preloadKernels(llDispatchSendKernel<true>, llDispatchSendKernel<false>, llDispatchRecvKernel<true>,
                        llDispatchRecvKernel<false>, llDispatchKernel<true, true>, llDispatchKernel<false, true>,
                        llDispatchKernel<true, false>, llDispatchKernel<false, false>);
}

}  // namespace EP_LL_VARIANT

}  // namespace cuda
}  // namespace ep
