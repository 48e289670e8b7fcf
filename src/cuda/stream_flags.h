// The proxy's flags in GPU memory (docs/PROXY.md, "The flags"): each write is
// a stream write of the value (cuStreamWriteValue64) on a stream of the
// proxy's own, so a kernel that waits on a flag spins on device memory,
// never on host memory, and no kernel launch or copy is needed per flag.
// Built with the CUDA backend (CUDA runtime; the driver function comes
// through cudaGetDriverEntryPointByVersion, so nothing links libcuda).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "proxy/proxy.h"

namespace ep {
namespace proxy {

class StreamFlags : public FlagWriter {
 public:
  // flags: nflags 8-byte words of device memory on `device`, which the
  // caller allocated (and zeroed) and frees after this is gone. Fails (with
  // *why) where the device cannot write 64-bit values from a stream.
  static bool create(int device, uint64_t* flags, int nflags, std::unique_ptr<StreamFlags>* out, std::string* why);
  ~StreamFlags() override;  // waits for the writes enqueued, destroys the stream

  // Enqueues flags[flag] = value on the proxy's stream (in order with the
  // earlier writes). From any thread; the first failure is kept and later
  // writes are dropped (a waiting kernel then sees the heartbeat stop).
  void write(int flag, uint64_t value) override;
  // Waits until every write enqueued so far is done.
  bool drain();
  std::string error() const;

 private:
  using WriteFn = int (*)(cudaStream_t, unsigned long long, unsigned long long, unsigned int);
  StreamFlags() = default;
  int device_ = 0;
  uint64_t* flags_ = nullptr;
  int nflags_ = 0;
  cudaStream_t stream_ = nullptr;
  WriteFn write_ = nullptr;
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace proxy
}  // namespace ep
