#include "handle_slots.h"

#include <new>

#include "../sizes.h"
#include "cuda_check.h"

namespace ep {
namespace cuda {

HandleSlots::HandleSlots(const BackendComm& comm, int device, int channels)
    : comm_(comm), dev_(device), channels_(channels) {
  const int R = comm_.nranks(), EL = comm_.localExperts();
  tok_pos_off_ = roundUp(sizeof(HState), 256);
  chan_off_ = tok_pos_off_ + roundUp(size_t(comm_.config().max_tokens_per_rank + 1) * R * sizeof(int), 256);
  expert_off_ = chan_off_ + roundUp(size_t(2) * R * channels_ * sizeof(int), 256);
  slot_bytes_ = expert_off_ + roundUp((size_t(2) * EL + 1) * sizeof(int), 256);
}

HandleSlots::~HandleSlots() {
  for (HandleSlot* s : all_) {
    cudaFree(s->mem);
    delete s;
  }
}

epResult_t HandleSlots::reserve(int n) {
  for (int i = 0; i < n; i++) {
    HandleSlot* s = nullptr;
    EPCHECK(allocate(&s));
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }
  return epSuccess;
}

epResult_t HandleSlots::acquire(HandleSlot** out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      *out = free_.back();
      free_.pop_back();
      return epSuccess;
    }
  }
  return allocate(out);
}

cudaError_t HandleSlots::zeroAll(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  for (HandleSlot* s : all_)
    if (const cudaError_t e = cudaMemsetAsync(s->mem, 0, slot_bytes_, stream)) return e;
  return cudaSuccess;
}

void HandleSlots::release(HandleSlot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

// Each step (the allocation, the zeroing) is one of init's checked steps
// (EP_TEST_CUDA_FAIL_STEP) when init reserves the first slots.
epResult_t HandleSlots::allocate(HandleSlot** out) {
  auto* s = new HandleSlot();
  RelaxedCaptureScope relaxed;  // a dispatch under capture may get here (more handles alive than slots)
  bool injected = injectedInitFailure();
  cudaError_t e = injected ? cudaErrorMemoryAllocation : cudaMalloc(&s->mem, slot_bytes_);
  if (e == cudaSuccess) {  // expert_acc starts (and is left) zeroed
    injected = injectedInitFailure();
    e = injected ? cudaErrorMemoryAllocation : zeroDeviceMemory(s->mem, slot_bytes_);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (s->mem) cudaFree(s->mem);
    delete s;
    return setError(comm_, epUnhandledCudaError, "cannot allocate %zu bytes of routing state on device %d: %s%s",
                    slot_bytes_, dev_, cudaGetErrorString(e), injected ? injectedNote() : "");
  }
  char* base = static_cast<char*>(s->mem);
  const int R = comm_.nranks(), EL = comm_.localExperts();
  s->hv.hs = reinterpret_cast<HState*>(base);
  s->hv.tok_pos = reinterpret_cast<int*>(base + tok_pos_off_);
  s->hv.chan_start = reinterpret_cast<int*>(base + chan_off_);
  s->hv.chan_count = s->hv.chan_start + size_t(R) * size_t(channels_);
  s->hv.expert_acc = reinterpret_cast<int*>(base + expert_off_);
  s->hv.expert_saved = s->hv.expert_acc + EL;
  s->hv.rows_without_ids = s->hv.expert_saved + EL;
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      all_.push_back(s);
    } catch (const std::bad_alloc&) {  // not yet owned by all_: freed here, or nothing would
      cudaFree(s->mem);
      delete s;
      throw;
    }
    // Room for every slot in free_ now, so that release (called from handle
    // destruction, which cannot fail) never allocates. A failure here leaves
    // s owned by all_.
    free_.reserve(all_.size());
  }
  *out = s;
  return epSuccess;
}

}  // namespace cuda
}  // namespace ep
