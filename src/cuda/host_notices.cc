#include "host_notices.h"

#include <chrono>

#include "../debug.h"
#include "cuda_check.h"
#include "cuda_common.h"

namespace ep {
namespace cuda {

HostNotices::~HostNotices() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (stream_) cudaStreamDestroy(stream_);
  if (one_) cudaFreeHost(one_);
}

epResult_t HostNotices::init() {
  CUDACHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  void* p = nullptr;
  CUDACHECK(cudaHostAlloc(&p, sizeof(int), cudaHostAllocDefault));
  one_ = static_cast<int*>(p);
  *one_ = 1;  // little endian: the first byte is 1 as well
  return epSuccess;
}

// Peers in another process (one in this process cannot exit alone).
bool HostNotices::watched(int r) const {
  const int me = comm_->rank;
  return r != me && comm_->peers[r].pid != comm_->peers[me].pid;
}

void HostNotices::watch() {
  bool any = false;
  for (int r = 0; r < comm_->nranks; r++) {
    any |= watched(r) && comm_->pid_visible[r];
    if (watched(r) && !comm_->pid_visible[r])
      EP_INFO(kSubsysCuda, "rank %d runs in another pid namespace: its exit is noticed at the timeout", r);
  }
  if (any) watcher_ = std::thread([this] { run(); });
}

void HostNotices::run() {
  cudaSetDevice(dev_);
  const int R = comm_->nranks;
  std::vector<bool> marked(size_t(R), false);
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
    for (int r = 0; r < R; r++) {
      const int pid = comm_->peers[r].pid;
      if (!watched(r) || marked[r] || !peerExited(comm_, r)) continue;
      marked[r] = true;
      EP_WARN(kSubsysCuda, "rank %d (pid %d) exited: this rank's waits for it end with epRemoteError", r, pid);
      markGone(r);
    }
  }
}

void HostNotices::markGone(int rank) {
  for (const Target& t : targets_) write(t.gone + rank, 1);
}

void HostNotices::abort() {
  for (const Target& t : targets_) write(t.timed_out, sizeof(int));
}

// A copy of 1 into dst on the notice stream, waited for. A failure is only
// logged: the waits then end at their timeout, as without the notice.
void HostNotices::write(void* dst, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(dev_);
  cudaError_t e = cudaMemcpyAsync(dst, one_, bytes, cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    EP_WARN(kSubsysCuda, "cannot tell the kernels of device %d (%s): they wait until their timeout", dev_,
            cudaGetErrorString(e));
  }
  if (prev >= 0 && prev != dev_) cudaSetDevice(prev);
}

}  // namespace cuda
}  // namespace ep
