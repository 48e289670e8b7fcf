// The device state of the high-throughput handles (cuda_common.h,
// HandleView: the routing positions, channel starts and expert counts of one
// routing), one slot per live handle, pooled. Slots are allocated at init
// (a few, so that most calls allocate nothing) and more when more handles
// are alive, during a graph capture too; each is freed with the pool.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "../backend_comm.h"
#include "cuda_common.h"

namespace ep {
namespace cuda {

struct HandleSlot {
  void* mem = nullptr;
  HandleView hv{};
};

class HandleSlots {
 public:
  // Slots for `channels` high-throughput channels on device `device`.
  HandleSlots(const BackendComm& comm, int device, int channels);
  ~HandleSlots();
  HandleSlots(const HandleSlots&) = delete;
  HandleSlots& operator=(const HandleSlots&) = delete;

  // n more slots in the pool (init).
  epResult_t reserve(int n);
  // A free slot, or a new one.
  epResult_t acquire(HandleSlot** out);
  // Back into the pool (any thread).
  void release(HandleSlot* slot);
  // epCommShrink: every slot zeroed, as at its allocation (a failed call may
  // have left expert counts half added), through stream s (not waited for).
  cudaError_t zeroAll(cudaStream_t s);

 private:
  epResult_t allocate(HandleSlot** out);

  BackendComm comm_;
  int dev_;
  int channels_;
  // A slot's layout: HState, then tok_pos, chan_start / chan_count, the expert counts.
  size_t tok_pos_off_ = 0, chan_off_ = 0, expert_off_ = 0, slot_bytes_ = 0;
  std::mutex mu_;
  std::vector<HandleSlot*> free_;
  std::vector<HandleSlot*> all_;
};

}  // namespace cuda
}  // namespace ep
