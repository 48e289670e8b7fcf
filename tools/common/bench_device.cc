#include "bench_device.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace tools {

namespace {

// Host memory: the host backend reads and writes the caller's buffers directly.
class HostDevice : public BenchDevice {
 public:
  const char* name() const override { return "host"; }
  epBackend_t backend() const override { return epBackendHost; }
  void* alloc(size_t bytes) override {
    // 64 bytes: a cache line, above the 16 the API asks for.
    size_t rounded = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded);
  }
  void release(void* p) override { free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { memcpy(dst, src, bytes); }
  void fill(void* p, int byte, size_t bytes) override { memset(p, byte, bytes); }
  const void* hostView(const void* p, size_t, std::vector<unsigned char>*) override { return p; }
  epStream_t stream() const override { return nullptr; }
  void synchronize() override {}  // host-backend calls return when they are done
};

}  // namespace

DeviceBuffer::DeviceBuffer(BenchDevice* dev, size_t bytes) : dev_(dev), bytes_(bytes) {
  if (bytes == 0) return;
  ptr_ = dev->alloc(bytes);
  if (ptr_ == nullptr) throw std::bad_alloc();
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    dev_ = o.dev_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ != nullptr) dev_->release(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

bool benchBackendSupported(const std::string& backend, std::string* error) {
  if (backend == "host") return true;
  if (backend == "cuda")
    *error = "--backend cuda is not implemented in this build of the tool (use --backend host)";
  else
    *error = "unknown backend '" + backend + "' for --backend (host or cuda)";
  return false;
}

std::unique_ptr<BenchDevice> makeBenchDevice(const std::string& backend, int rank, std::string* error) {
  (void)rank;  // a GPU device picks its device from the rank
  if (!benchBackendSupported(backend, error)) return nullptr;
  return std::make_unique<HostDevice>();
}

}  // namespace tools
