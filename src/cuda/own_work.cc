#include "own_work.h"

#include "../debug.h"
#include "cuda_check.h"

namespace ep {
namespace cuda {

OwnWork::~OwnWork() { release(); }

void OwnWork::release() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const StreamMark& m : eager_) cudaEventDestroy(m.done);
  for (cudaEvent_t e : captured_) cudaEventDestroy(e);
  eager_.clear();
  captured_.clear();
  tracking_ = false;
}

cudaEvent_t OwnWork::newEvent() {
  RelaxedCaptureScope relaxed;  // a call under capture creates its graph's event here
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return e;
}

void OwnWork::mark(cudaStream_t stream) {
  if (!tracking_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &st);
  cudaEvent_t ev = nullptr;
  if (e == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    ev = newEvent();
    if (ev != nullptr) {
      e = cudaEventRecordWithFlags(ev, stream, cudaEventRecordExternal);
      captured_.push_back(ev);
    }
  } else if (e == cudaSuccess) {
    for (const StreamMark& m : eager_)
      if (m.stream == stream) ev = m.done;
    if (ev == nullptr && (ev = newEvent()) != nullptr) eager_.push_back({stream, ev});
    if (ev != nullptr) e = cudaEventRecord(ev, stream);
  }
  if (e != cudaSuccess || ev == nullptr) {
    cudaGetLastError();
    lost_ = true;
    EP_WARN(kSubsysCuda, "cannot mark the end of this rank's call on its stream (%s): its destroy waits for the "
            "whole GPU, which another rank of this process shares",
            e != cudaSuccess ? cudaGetErrorString(e) : "no event");
  }
}

cudaError_t OwnWork::wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tracking_ || lost_) return cudaDeviceSynchronize();
  cudaError_t first = cudaSuccess;
  auto waitFor = [&](cudaEvent_t ev) {
    const cudaError_t e = cudaEventSynchronize(ev);
    if (e != cudaSuccess && first == cudaSuccess) first = e;
  };
  for (const StreamMark& m : eager_) waitFor(m.done);
  for (cudaEvent_t ev : captured_) waitFor(ev);
  return first;
}

}  // namespace cuda
}  // namespace ep
