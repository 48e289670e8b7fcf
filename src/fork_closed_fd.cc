#include "fork_closed_fd.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace ep {

namespace {

struct Registry {
  std::mutex mu;
  std::vector<int> fds;
};

void lockInFork();
void unlockInFork();
void closeAllInChild();

// Never destroyed: a detached root thread may still close its sockets while
// the process runs its static destructors.
Registry& registry() {
  static Registry* r = [] {
    auto* made = new Registry;
    pthread_atfork(lockInFork, unlockInFork, closeAllInChild);
    return made;
  }();
  return *r;
}

void lockInFork() { registry().mu.lock(); }
void unlockInFork() { registry().mu.unlock(); }
void closeAllInChild() {
  Registry& r = registry();
  for (int fd : r.fds) ::close(fd);
  r.fds.clear();
  r.mu.unlock();
}

}  // namespace

void ForkClosedFd::lockRegistry() { registry().mu.lock(); }
void ForkClosedFd::unlockRegistry() { registry().mu.unlock(); }
void ForkClosedFd::reserveSlot() { registry().fds.reserve(registry().fds.size() + 1); }
int ForkClosedFd::registerLocked(int fd) {
  registry().fds.push_back(fd);
  return fd;
}

void ForkClosedFd::reset() {
  if (fd_ < 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.fds.erase(std::remove(r.fds.begin(), r.fds.end(), fd_), r.fds.end());
  ::close(fd_);
  fd_ = -1;
}

Fd ForkClosedFd::release() {
  if (fd_ < 0) return Fd();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.fds.erase(std::remove(r.fds.begin(), r.fds.end(), fd_), r.fds.end());
  Fd out(fd_);
  fd_ = -1;
  return out;
}

}  // namespace ep
