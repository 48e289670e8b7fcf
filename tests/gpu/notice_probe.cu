// What the CUDA backend's host notices rely on, measured: while one thread
// of a process waits for the whole device (cudaDeviceSynchronize, cudaFree)
// and a kernel spins on a word in device memory, can another thread still
// write that word with a copy on a non-blocking stream of its own (what
// HostNotices::write does) and so end the kernel? If not, the device-wide
// wait holds the notice up until the kernel's own timeout.
//   notice_probe   prints, per kind of wait, when the copy landed and when
//                  the wait returned (the kernel gives up after 3 s)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <thread>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 2;                                                                        \
    }                                                                                  \
  } while (0)

__global__ void spin(volatile int* word, unsigned long long limit_ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*word == 0 && t - t0 < limit_ns);
}

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Returns 1 when the notice was held up, 2 on a CUDA error.
int probe(const char* kind) {
  int* word = nullptr;
  void* victim = nullptr;
  int* one = nullptr;
  CK(cudaMalloc(&word, sizeof(int)));
  CK(cudaMemset(word, 0, sizeof(int)));
  CK(cudaMalloc(&victim, 1 << 20));
  CK(cudaHostAlloc(&one, sizeof(int), cudaHostAllocDefault));
  *one = 1;
  cudaStream_t ks, ns;
  CK(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&ns, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  const auto t0 = Clock::now();
  spin<<<1, 1, 0, ks>>>(word, 3000000000ull);
  double wait_ms = -1, notice_ms = -1;
  std::thread waiter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (kind[0] == 's') cudaDeviceSynchronize();
    else cudaFree(victim);
    wait_ms = msSince(t0);
  });
  std::thread notifier([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cudaMemcpyAsync(word, one, sizeof(int), cudaMemcpyHostToDevice, ns);
    cudaStreamSynchronize(ns);
    notice_ms = msSince(t0);
  });
  waiter.join();
  notifier.join();
  CK(cudaDeviceSynchronize());
  printf("%-22s notice copied at %7.1f ms, the wait returned at %7.1f ms: %s\n", kind, notice_ms, wait_ms,
         notice_ms < 1000 ? "the notice got through" : "HELD UP until the kernel's own timeout");
  if (kind[0] == 's') cudaFree(victim);
  cudaFree(word);
  cudaFreeHost(one);
  cudaStreamDestroy(ks);
  cudaStreamDestroy(ns);
  return notice_ms < 1000 ? 0 : 1;
}

// Exit 0 when the notice gets through a cudaDeviceSynchronize (what the
// destroy of a rank on a GPU shared in one process relies on); the cudaFree
// line is printed for the record (it was held up on H100 and H200).
int main() {
  const int sync = probe("synchronize (device)");
  const int freed = probe("free (cudaFree)");
  return sync != 0 ? 1 : freed == 2 ? 1 : 0;
}
