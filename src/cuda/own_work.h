// What a rank's destroy waits for before it tells its peers that it left:
// its own kernels, not the whole GPU. Peers read "destroyed" as "everything
// it sent has landed", so the destroy must wait for its kernels; but where
// another rank of this process drives the same GPU, cudaDeviceSynchronize
// also waits for that rank's kernels, and one of them may be waiting for
// this rank (a call this rank will never make): the destroy then came only
// at that kernel's timeout. So on such a GPU the backend marks the end of
// each of its calls with an event on the caller's stream, and the destroy
// waits for those events alone.
//
// Calls captured into a CUDA graph record an event of their own as an
// external event node of the graph (cudaEventRecordExternal), so that each
// replay marks it again. Such graphs therefore hold event-record nodes,
// which CUDA does not allow inside conditional nodes or device-launched
// graphs, and each capture keeps one event until the communicator goes. Everywhere else (a GPU this rank's process drives
// with no other rank) nothing is recorded and the destroy waits for the
// device, as before: no cost on the calls.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

namespace ep {
namespace cuda {

class OwnWork {
 public:
  OwnWork() = default;
  ~OwnWork();
  OwnWork(const OwnWork&) = delete;
  OwnWork& operator=(const OwnWork&) = delete;

  // Another rank of this process drives this GPU: calls are marked from now on.
  void track() { tracking_ = true; }
  bool tracking() const { return tracking_; }
  // The end of a call's work on `stream` (after its last launch). A failure
  // to record is logged and remembered: wait() then waits for the device.
  void mark(cudaStream_t stream);
  // Every marked call has finished (or, untracked or after a failed mark,
  // the whole device has). Returns CUDA's result.
  cudaError_t wait();
  // The events destroyed (with the owner's device current); nothing is marked after.
  void release();

 private:
  struct StreamMark {
    cudaStream_t stream;
    cudaEvent_t done;
  };
  cudaEvent_t newEvent();

  bool tracking_ = false;
  bool lost_ = false;  // a mark failed: wait for the device
  std::mutex mu_;
  std::vector<StreamMark> eager_;      // the latest call on each stream
  std::vector<cudaEvent_t> captured_;  // one per captured call, recorded by every replay
};

}  // namespace cuda
}  // namespace ep
