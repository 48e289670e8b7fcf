// Moving a call's buffers between the caller's memory and host memory, for
// the staged backend (src/host/staged.h): the host backend's algorithms run
// on host copies of the inputs, and the outputs go back to where the caller
// wants them. On a GPU (src/cuda/cuda_stager.cc) the caller's buffers are
// device memory and the copies are cudaMemcpyAsync on the caller's stream
// into pinned buffers; in tests (HostStager, staged.cc) they are memcpy into
// buffers of the exact size, so that a wrong size shows under ASan.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "moeep.h"

namespace ep {

// Host memory a call stages through, given back to its stager when dropped.
class StagingBuffer {
 public:
  virtual ~StagingBuffer() = default;
  virtual void* data() = 0;
};

// One region that goes back to the caller: `rows` rows of `width` bytes,
// `pitch` bytes apart on both sides.
struct CopyBack {
  void* dst;
  const void* host;
  size_t width, rows, pitch;
};

// Every call that fails has already set the communicator's error (setError).
class Stager {
 public:
  virtual ~Stager() = default;
  // What the calls are staged for, in messages ("GPU 0", "host memory").
  virtual const char* where() const = 0;
  // Host memory of at least `bytes` (0: none), reused between calls where it can be.
  virtual epResult_t acquire(size_t bytes, std::unique_ptr<StagingBuffer>* out) = 0;
  // A call begins / ends on this thread (the GPU made current, and given back).
  virtual epResult_t enter() = 0;
  virtual void leave() = 0;
  // True while `stream` is being captured into a graph: the staged calls
  // wait on the host, so they refuse to be captured.
  virtual bool capturing(epStream_t stream) = 0;
  // Copies in stream order: caller's memory -> host, `rows` rows of `width`
  // bytes `pitch` bytes apart into packed rows (rows = 1: a plain copy).
  virtual epResult_t toHost(void* host, const void* src, size_t width, size_t rows, size_t pitch,
                            epStream_t stream) = 0;
  // Waits until every copy to the host enqueued on stream (and the caller's
  // work before it) is done, so the host may read them.
  virtual epResult_t fence(epStream_t stream) = 0;
  // Host -> caller's memory, in stream order: `rows` rows of `width` bytes,
  // `pitch` bytes apart on both sides (rows = 1: a plain copy).
  virtual epResult_t toCaller(void* dst, const void* host, size_t width, size_t rows, size_t pitch,
                              epStream_t stream) = 0;
  // Every region of `copies` back, in stream order; the regions do not
  // overlap. One toCaller each unless the stager can do better: a call's
  // outputs are often hundreds of small regions (a low-latency dispatch's
  // rows of each local expert).
  virtual epResult_t toCallerAll(const std::vector<CopyBack>& copies, epStream_t stream) {
    for (const CopyBack& c : copies) {
      const epResult_t res = toCaller(c.dst, c.host, c.width, c.rows, c.pitch, stream);
      if (res != epSuccess) return res;
    }
    return epSuccess;
  }
  // Every byte of dst set to `value`, in stream order.
  virtual epResult_t fill(void* dst, int value, size_t bytes, epStream_t stream) = 0;
  // Waits until the copies back are done, so that their staging may be reused.
  virtual epResult_t finish(epStream_t stream) = 0;
  // The same after a failure: best effort, the communicator's error left as it is.
  virtual void drain(epStream_t stream) = 0;
};

}  // namespace ep
