// Where ep_bench keeps its buffers and how it waits for a call to finish: the
// part of the benchmark that changes with the library's backend. Only the host
// backend is implemented here; a GPU device adds a class next to HostDevice
// and a case in makeBenchDevice, and the benchmark itself stays the same.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "moeep.h"

namespace tools {

class BenchDevice {
 public:
  virtual ~BenchDevice() = default;
  virtual const char* name() const = 0;
  // What to put in epConfig_t.backend.
  virtual epBackend_t backend() const = 0;
  // Memory the library reads and writes (16-byte aligned, or more). NULL on failure.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Host data into device memory, and back.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Sets `bytes` of device memory at p to `byte` (memset).
  virtual void fill(void* p, int byte, size_t bytes) = 0;
  // A host-readable view of `bytes` of device memory at p: p itself when the
  // host can read it, else a copy in *staging.
  virtual const void* hostView(const void* p, size_t bytes, std::vector<unsigned char>* staging) = 0;
  // The stream of every library call (NULL on the host backend).
  virtual epStream_t stream() const = 0;
  // Waits until every call on stream() has finished, so that a host clock
  // around call + synchronize measures the call.
  virtual void synchronize() = 0;
};

// A buffer of device memory that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(BenchDevice* dev, size_t bytes);  // throws std::bad_alloc when out of memory
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void reset();

 private:
  BenchDevice* dev_ = nullptr;
  void* ptr_ = nullptr;  // NULL when bytes_ == 0: the library accepts NULL for empty arrays
  size_t bytes_ = 0;
};

// Whether this build of the tool can run `backend` (checked before ranks start).
bool benchBackendSupported(const std::string& backend, std::string* error);

// The device of a backend: "host" for now. NULL and *error set when this build
// of the tool cannot run that backend.
std::unique_ptr<BenchDevice> makeBenchDevice(const std::string& backend, int rank, std::string* error);

}  // namespace tools
