#include "cuda/stream_flags.h"

#include <cstdio>

namespace ep {
namespace proxy {

namespace {
// CUresult values and the attribute of cuda.h, kept here so that this file
// needs only the runtime's header.
constexpr int kCuSuccess = 0;
}  // namespace

bool StreamFlags::create(int device, uint64_t* flags, int nflags, std::unique_ptr<StreamFlags>* out,
                         std::string* why) {
  std::unique_ptr<StreamFlags> f(new StreamFlags());
  f->device_ = device;
  f->flags_ = flags;
  f->nflags_ = nflags;
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    *why = std::string("cudaSetDevice: ") + cudaGetErrorString(err);
    return false;
  }
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // cuStreamWriteValue64 as of CUDA 12.0 (its _v2 ABI).
  err = cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &fn, 12000, cudaEnableDefault, &found);
  if (err != cudaSuccess || fn == nullptr || found != cudaDriverEntryPointSuccess) {
    *why = std::string("no cuStreamWriteValue64 in the driver: ") +
           (err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found");
    return false;
  }
  f->write_ = reinterpret_cast<WriteFn>(fn);
  err = cudaStreamCreateWithFlags(&f->stream_, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    *why = std::string("cudaStreamCreateWithFlags: ") + cudaGetErrorString(err);
    return false;
  }
  // One write of 0 to the first flag, waited for: a GPU or driver without
  // 64-bit stream memory operations fails here, not in the proxy's thread.
  f->write(0, 0);
  if (!f->drain()) {
    *why = "GPU " + std::to_string(device) + " cannot write 64-bit values from a stream: " + f->error();
    return false;
  }
  *out = std::move(f);
  return true;
}

StreamFlags::~StreamFlags() {
  if (stream_ != nullptr) {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void StreamFlags::write(int flag, uint64_t value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) return;
  if (flag < 0 || flag >= nflags_) {
    error_ = "flag " + std::to_string(flag) + " is not one of the " + std::to_string(nflags_) + " flags";
    return;
  }
  // The proxy's thread has no current device of its own until it writes.
  thread_local int current = -1;
  if (current != device_) {
    if (cudaSetDevice(device_) != cudaSuccess) {
      error_ = "cudaSetDevice on the proxy's thread failed";
      return;
    }
    current = device_;
  }
  const int res = write_(stream_, reinterpret_cast<unsigned long long>(flags_ + flag), value, 0);
  if (res != kCuSuccess) error_ = "cuStreamWriteValue64 failed with CUresult " + std::to_string(res);
}

bool StreamFlags::drain() {
  cudaSetDevice(device_);
  const cudaError_t err = cudaStreamSynchronize(stream_);
  std::lock_guard<std::mutex> lock(mu_);
  if (err != cudaSuccess && error_.empty()) error_ = std::string("the flag stream: ") + cudaGetErrorString(err);
  return error_.empty();
}

std::string StreamFlags::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace proxy
}  // namespace ep
