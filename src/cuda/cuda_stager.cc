// The staged backend's copies on a GPU (src/stager.h): the caller's device
// buffers to and from pinned host buffers, by cudaMemcpyAsync on the
// caller's stream. Pinned memory is slow to allocate, so buffers go back to
// a pool when a call drops them and the next call of a like size takes one.
#include <algorithm>
#include <mutex>
#include <vector>

#include "../backend.h"
#include "../debug.h"
#include "../params.h"
#include "cuda_check.h"

namespace ep {
namespace {

constexpr size_t kMinPinned = 64 << 10;       // small stagings share a size class
constexpr size_t kMaxKeptPinned = size_t(2) << 30;  // pinned bytes kept free for later calls

// The size class of a request: 64 KiB, else the next 2^k x {1, 1.25, 1.5,
// 1.75} (at most a quarter more than asked), so that sizes that drift from
// call to call (received rows) reuse blocks instead of piling up new ones.
size_t sizeClass(size_t bytes) {
  if (bytes <= kMinPinned) return kMinPinned;
  size_t p = kMinPinned;
  while (p * 2 < bytes) p *= 2;
  for (size_t q = 1; q <= 4; q++)
    if (p + p * q / 4 >= bytes) return p + p * q / 4;
  return p * 2;
}

class CudaStager : public Stager {
 public:
  CudaStager(const BackendComm& comm, int device) : comm_(comm), device_(device) {
    snprintf(where_, sizeof(where_), "pinned host memory of GPU %d", device);
  }
  ~CudaStager() override {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    for (const Block& b : free_) cudaFreeHost(b.ptr);
    if (prev >= 0) cudaSetDevice(prev);
    cudaGetLastError();
  }

  const char* where() const override { return where_; }

  epResult_t acquire(size_t bytes, std::unique_ptr<StagingBuffer>* out) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->bytes == sizeClass(bytes)) {
          Block b = *it;
          free_.erase(it);
          free_bytes_ -= b.bytes;
          out->reset(new Buffer(this, b));
          return epSuccess;
        }
    }
    Block b;
    b.bytes = sizeClass(bytes);
    CUDACHECK(cudaHostAlloc(&b.ptr, b.bytes, cudaHostAllocPortable));
    out->reset(new Buffer(this, b));
    return epSuccess;
  }

  epResult_t enter() override {
    CUDACHECK(cudaGetDevice(&caller_device_));
    if (caller_device_ != device_) CUDACHECK(cudaSetDevice(device_));
    return epSuccess;
  }
  void leave() override {
    if (caller_device_ >= 0 && caller_device_ != device_) cudaSetDevice(caller_device_);
    caller_device_ = -1;
  }
  bool capturing(epStream_t stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
      // The legacy stream while another thread captures in global mode: a
      // copy and a wait on it would invalidate that capture. Refused too.
      cudaGetLastError();
      return true;
    }
    return status != cudaStreamCaptureStatusNone;
  }
  epResult_t toHost(void* host, const void* src, size_t width, size_t rows, size_t pitch,
                    epStream_t stream) override {
    if (rows == 1)
      CUDACHECK(cudaMemcpyAsync(host, src, width, cudaMemcpyDefault, stream));
    else
      CUDACHECK(cudaMemcpy2DAsync(host, width, src, pitch, width, rows, cudaMemcpyDefault, stream));
    return epSuccess;
  }
  epResult_t fence(epStream_t stream) override {
    CUDACHECK(cudaStreamSynchronize(stream));
    return epSuccess;
  }
  epResult_t toCaller(void* dst, const void* host, size_t width, size_t rows, size_t pitch,
                      epStream_t stream) override {
    if (rows == 1)
      CUDACHECK(cudaMemcpyAsync(dst, host, width, cudaMemcpyDefault, stream));
    else
      CUDACHECK(cudaMemcpy2DAsync(dst, pitch, host, pitch, width, rows, cudaMemcpyDefault, stream));
    return epSuccess;
  }
  // A call's outputs are often hundreds of small regions (a low-latency
  // dispatch's rows per local expert): one cudaMemcpyAsync each costs a few
  // microseconds of the host's time apiece, so they go in one
  // cudaMemcpyBatchAsync (CUDA 12.8). Pitched regions of a few rows are cut
  // into rows for it; longer ones stay 2D copies. Where the batch is refused
  // (the legacy stream, an older driver), one copy each; EP_CUDA_STAGE_BATCH=0
  // takes one copy each too (docs/BENCHMARKS.md, 2026-12-07: on an H100 the
  // batch made an eager 2-node layer 20% faster at 128 tokens).
  epResult_t toCallerAll(const std::vector<CopyBack>& copies, epStream_t stream) override {
    batch_dst_.clear();
    batch_src_.clear();
    batch_size_.clear();
    for (const CopyBack& c : copies) {
      if (c.rows == 1 || c.width == c.pitch) {
        addToBatch(c.dst, c.host, c.width * c.rows);
      } else if (c.rows <= kRowsCutForBatch) {
        for (size_t r = 0; r < c.rows; r++)
          addToBatch(static_cast<char*>(c.dst) + r * c.pitch, static_cast<const char*>(c.host) + r * c.pitch, c.width);
      } else {
        CUDACHECK(cudaMemcpy2DAsync(c.dst, c.pitch, c.host, c.pitch, c.width, c.rows, cudaMemcpyDefault, stream));
      }
    }
    if (batch_dst_.empty()) return epSuccess;
    if (batch_dst_.size() > 1 && stream != nullptr && param::CUDA_STAGE_BATCH() != 0) {
      cudaMemcpyAttributes attr = {};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      const cudaError_t e = cudaMemcpyBatchAsync(batch_dst_.data(), batch_src_.data(), batch_size_.data(),
                                                 batch_dst_.size(), &attr, &first, 1, stream);
      if (e == cudaSuccess) return epSuccess;
      cudaGetLastError();
      if (!batch_refused_) {
        batch_refused_ = true;
        EP_INFO(kSubsysInit, "cuda_staged: cudaMemcpyBatchAsync refused (%s): copies back one by one",
                cudaGetErrorString(e));
      }
    }
    for (size_t i = 0; i < batch_dst_.size(); i++)  // the same bytes again where a refused batch wrote some
      CUDACHECK(cudaMemcpyAsync(batch_dst_[i], batch_src_[i], batch_size_[i], cudaMemcpyDefault, stream));
    return epSuccess;
  }
  epResult_t fill(void* dst, int value, size_t bytes, epStream_t stream) override {
    CUDACHECK(cudaMemsetAsync(dst, value, bytes, stream));
    return epSuccess;
  }
  epResult_t finish(epStream_t stream) override {
    CUDACHECK(cudaStreamSynchronize(stream));
    return epSuccess;
  }
  void drain(epStream_t stream) override {
    cudaStreamSynchronize(stream);
    cudaGetLastError();
  }

 private:
  static constexpr size_t kRowsCutForBatch = 64;
  void addToBatch(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    batch_dst_.push_back(dst);
    batch_src_.push_back(src);
    batch_size_.push_back(bytes);
  }
  std::vector<void*> batch_dst_;
  std::vector<const void*> batch_src_;
  std::vector<size_t> batch_size_;
  bool batch_refused_ = false;

  struct Block {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  class Buffer : public StagingBuffer {
   public:
    Buffer(CudaStager* owner, Block b) : owner_(owner), block_(b) {}
    ~Buffer() override { owner_->giveBack(block_); }
    void* data() override { return block_.ptr; }

   private:
    CudaStager* owner_;
    Block block_;
  };
  void giveBack(const Block& b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
    free_bytes_ += b.bytes;
    // Beyond the bound, the blocks least recently given back are freed (a
    // cudaFreeHost, after the call's copies were waited for).
    while (free_bytes_ > kMaxKeptPinned && free_.size() > 1) {
      cudaFreeHost(free_.front().ptr);
      free_bytes_ -= free_.front().bytes;
      free_.erase(free_.begin());
    }
  }

  BackendComm comm_;
  int device_;
  int caller_device_ = -1;
  char where_[64];
  std::mutex mu_;
  std::vector<Block> free_;
  size_t free_bytes_ = 0;
};

}  // namespace

epResult_t createCudaStager(const BackendComm& comm, std::unique_ptr<Stager>* out) {
  int device = -1;
  char bus_id[32];
  if (!cudaDeviceIdentity(comm.config().device, &device, bus_id, sizeof(bus_id)))
    return setError(comm, epNotSupported, "no GPU for the staged path (config.device = %d)", comm.config().device);
  out->reset(new CudaStager(comm, device));
  return epSuccess;
}

}  // namespace ep
