// What the host learns while kernels spin, written into the device words
// their waits read in their slow path (every 64 spins):
//   - a peer process of this node that exited: a watcher thread polls the
//     peers' pids every 100 ms and sets gone[rank] (the waits for that rank
//     then end with epRemoteError, reported at the next call, instead of at
//     the timeout);
//   - epCommAbort of this communicator: timed_out = 1 (every wait leaves, so
//     the kernels end and the communicator can be freed at once).
// The words are this rank's own device memory, written by copies on a stream
// of their own, which run beside kernels that spin on the caller's stream.
// Peers in this process are not watched (they cannot exit alone), nor peers
// in another pid namespace (their pids mean nothing here).
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "../comm.h"

namespace ep {
namespace cuda {

class HostNotices {
 public:
  explicit HostNotices(epComm* comm, int device) : comm_(comm), dev_(device) {}
  ~HostNotices();
  epResult_t init();
  // The timed_out word and the gone[kMaxRanks] bytes of one kernel family.
  void addTarget(int* timed_out, uint8_t* gone) { targets_.push_back({timed_out, gone}); }
  // Starts the watcher when a peer runs in another process (after every addTarget).
  void watch();
  // epCommAbort: every wait of this rank leaves.
  void abort();

 private:
  struct Target {
    int* timed_out;
    uint8_t* gone;
  };
  bool watched(int rank) const;
  void run();
  void markGone(int rank);
  void write(void* dst, size_t bytes);

  epComm* comm_;
  int dev_;
  cudaStream_t stream_ = nullptr;
  int* one_ = nullptr;  // pinned source of the copies: 1 (int) / 1 (byte)
  std::vector<Target> targets_;
  std::mutex mu_;  // the stream and one_ (the watcher and abort may both write)
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace cuda
}  // namespace ep
