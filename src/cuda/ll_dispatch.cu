// Low-latency dispatch kernels and their launches (device code in
// ll_dispatch.cuh; small calls' send half: ll_dispatch_small.cu).
#include "ll_dispatch.cuh"
#include "preload.cuh"

namespace ep {
namespace cuda {

namespace {

template <bool kSingles>
__global__ void __launch_bounds__(kThreads, 1) llDispatchSendKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = p.v.local->pairs;
  llTimeStart(p.v, pair, kLLKindDispatch);
  dispatchSendPhase<kSingles>(p, pair);
  llTimeEnd(p.v, pair, kLLKindDispatch);
}

template <bool kFlagSources>
__global__ void __launch_bounds__(kThreads, 1) llDispatchRecvKernel(const __grid_constant__ LLDispatchParams p) {
  const uint64_t pair = p.hd->pair;
  llTimeStart(p.v, pair, kLLKindDispatchRecv);
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
  const uint64_t pair = p.v.local->pairs;
  llTimeStart(p.v, pair, kLLKindDispatch);
  dispatchSendPhase<kSingles>(p, pair);
  dispatchRecvPhase<kFlagSources>(p, pair, kLLKindDispatch);
  llTimeEnd(p.v, pair, kLLKindDispatch);
}

}  // namespace

// Small calls (tokens at most a quarter of the grid: at least two row blocks
// per token) send through the row-slice kernels unless EP_CUDA_LL_SLICES
// says otherwise (`slices`: -1 auto, 0 never, 1 always); calls sending
// flagged records always do (only those kernels send them). Either kernel is
// correct for any other call; this only picks the faster.
static bool useSlices(const LLDispatchParams& p, int sms, int slices) {
  return p.flagged || slices > 0 || (slices < 0 && 4 * p.num_tokens <= llGrid(sms));
}

int launchLLDispatchSend(const LLDispatchParams& p, int sms, int slices, void* stream) {
  if (useSlices(p, sms, slices)) return launchLLDispatchSlices(p, sms, stream, true);
  return llUsesSingles(p.v) ? llLaunch(llDispatchSendKernel<true>, p, kThreads, sms, stream)
                            : llLaunch(llDispatchSendKernel<false>, p, kThreads, sms, stream);
}

int launchLLDispatch(const LLDispatchParams& p, int sms, int slices, void* stream) {
  if (useSlices(p, sms, slices)) return launchLLDispatchSlices(p, sms, stream, false);
  if (p.flag_sources)
    return llUsesSingles(p.v) ? llLaunch(llDispatchKernel<true, true>, p, kThreads, sms, stream)
                              : llLaunch(llDispatchKernel<false, true>, p, kThreads, sms, stream);
  return llUsesSingles(p.v) ? llLaunch(llDispatchKernel<true, false>, p, kThreads, sms, stream)
                            : llLaunch(llDispatchKernel<false, false>, p, kThreads, sms, stream);
}

// The receive half of a call whose send took the row slices: the receive
// slices where the records are few (decided in the kernel).
int launchLLDispatchRecv(const LLDispatchParams& p, int sms, int slices, void* stream) {
  if (useSlices(p, sms, slices)) return launchLLDispatchRecvSlices(p, sms, stream);
  return p.flag_sources ? llLaunch(llDispatchRecvKernel<true>, p, kThreads, sms, stream)
                        : llLaunch(llDispatchRecvKernel<false>, p, kThreads, sms, stream);
}

int preloadLLDispatchKernels() {
  return preloadKernels(llDispatchSendKernel<true>, llDispatchSendKernel<false>, llDispatchRecvKernel<true>,
                        llDispatchRecvKernel<false>, llDispatchKernel<true, true>, llDispatchKernel<false, true>,
                        llDispatchKernel<true, false>, llDispatchKernel<false, false>);
}

}  // namespace cuda
}  // namespace ep
