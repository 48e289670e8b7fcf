// Descriptors that a forked child closes at once: the listening sockets of the
// bootstrap (the root's, the ranks' ring listeners, the transports' to come)
// and the connections they hold.
//
// A child forked after epGetUniqueId (a launcher's rank), or while a rank's
// init waits in another thread, inherits these sockets: close-on-exec covers
// exec only, and the thread that serves them does not exist in the child. Its
// copy of a listener would keep the port open after the owner closed it, and
// a late rank would wait there for an answer that never comes. A
// pthread_atfork handler closes them in the child. Every such descriptor is
// opened and closed under one mutex, which the fork handlers hold across
// fork(): the child sees exactly the open ones, and never closes a number that
// another thread got back from the kernel meanwhile.
#pragma once

#include <utility>

#include "socket.h"

namespace ep {

// One registered descriptor, closed on destruction. Move-only.
class ForkClosedFd {
 public:
  ForkClosedFd() = default;
  ForkClosedFd(ForkClosedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ForkClosedFd& operator=(ForkClosedFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  ForkClosedFd(const ForkClosedFd&) = delete;
  ForkClosedFd& operator=(const ForkClosedFd&) = delete;
  ~ForkClosedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Unregisters and closes (no-op when empty).
  void reset();
  // Unregisters the descriptor and hands it over as a plain Fd, which a
  // forked child keeps (a ring connection that the rank now owns).
  Fd release();

  // Runs open(Fd*) (a socket call that fills it) and registers what it made,
  // both under the registry's lock; returns what open returned.
  template <typename Open>
  auto open(Open open) -> decltype(open(static_cast<Fd*>(nullptr))) {
    reset();
    lockRegistry();
    struct Unlock {
      ~Unlock() { unlockRegistry(); }
    } unlock;
    reserveSlot();  // a throw here leaves fd to close itself
    Fd fd;
    auto result = open(&fd);
    if (fd.valid()) fd_ = registerLocked(fd.release());
    return result;
  }

 private:
  static void lockRegistry();
  static void unlockRegistry();
  static void reserveSlot();
  static int registerLocked(int fd);

  int fd_ = -1;
};

}  // namespace ep
