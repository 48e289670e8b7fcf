// shm: host memory shared between the processes (or threads) of one machine.
//
// reg_mem creates a file in EP_SHM_DIR (/dev/shm), sizes it with
// posix_fallocate so that a full tmpfs fails here with a clear error rather
// than with SIGBUS on first touch, and maps it. The exported handle is the
// file's path; peers map it in connect. Once every peer is connected the core
// calls `connected` and the name is unlinked, so nothing is left behind when
// the processes exit, however they exit.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <random>

#include "transport.h"

namespace {

constexpr uint32_t kHandleMagic = 0x65705368u;  // 'epSh'

struct ShmHandle {
  uint32_t magic;
  uint32_t pad;
  uint64_t size;
  char path[EP_TRANSPORT_HANDLE_BYTES - 16];
};
static_assert(sizeof(ShmHandle) <= EP_TRANSPORT_HANDLE_BYTES, "handle too large");

struct ShmContext {
  const epTransportEnv_v1_t* env;
  char dir[sizeof(ShmHandle::path) - 40];  // room left for "/moeep-<pid>-<n>-<random>"
};

struct ShmMem {
  void* ptr;
  size_t size;
  char path[sizeof(ShmHandle::path)];
  bool linked;
};

struct ShmConn {
  void* ptr;
  size_t size;
};

#define SHM_LOG(ctx, level, ...) (ctx)->env->log((level), "shm", __VA_ARGS__)

// A segment is unlinked as soon as every peer mapped it, so one that is still
// there belongs to an init that never finished. Those whose creator process
// is gone and that are older than any init can last are removed here (a rank
// killed during init would otherwise leave its segment behind for good).
void removeStaleSegments(ShmContext* ctx) {
  DIR* d = opendir(ctx->dir);
  if (d == nullptr) return;
  const time_t old = time(nullptr) - 600;
  while (struct dirent* e = readdir(d)) {
    int pid = 0;
    if (sscanf(e->d_name, "moeep-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    char path[sizeof(ShmHandle::path) + 256];
    snprintf(path, sizeof(path), "%s/%s", ctx->dir, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0 || st.st_mtime > old) continue;
    if (unlink(path) == 0) SHM_LOG(ctx, epTransportLogInfo, "removed %s, left by process %d", path, pid);
  }
  closedir(d);
}

epResult_t shmInit(const epTransportEnv_v1_t* env, void** out) {
  auto* ctx = new (std::nothrow) ShmContext();
  if (ctx == nullptr) return epOutOfMemory;
  ctx->env = env;
  const char* dir = env->get_param("SHM_DIR");
  if (dir == nullptr || *dir == '\0') dir = "/dev/shm";
  if (strlen(dir) >= sizeof(ctx->dir)) {
    SHM_LOG(ctx, epTransportLogWarn, "EP_SHM_DIR is %zu characters long, more than the %zu this transport takes",
            strlen(dir), sizeof(ctx->dir) - 1);
    delete ctx;
    return epInvalidArgument;
  }
  snprintf(ctx->dir, sizeof(ctx->dir), "%s", dir);
  struct stat st;
  if (stat(ctx->dir, &st) != 0) {
    SHM_LOG(ctx, epTransportLogWarn, "directory %s: %s: shm transport disabled", ctx->dir, strerror(errno));
    delete ctx;
    return epSystemError;
  }
  if (!S_ISDIR(st.st_mode)) {
    SHM_LOG(ctx, epTransportLogWarn, "%s is not a directory: shm transport disabled", ctx->dir);
    delete ctx;
    return epSystemError;
  }
  removeStaleSegments(ctx);
  *out = ctx;
  return epSuccess;
}

epResult_t shmProperties(void*, epTransportProps_v1_t* props) {
  props->name = "shm";
  props->caps = EP_TRANSPORT_CAP_LOAD_STORE | EP_TRANSPORT_CAP_HOST_MEM;
  props->latency_us = 1;
  props->bandwidth_gbps = 80;
  return epSuccess;
}

epResult_t shmCanConnect(void*, const epPeerInfo_v1_t* self, const epPeerInfo_v1_t* peer, int* ok) {
  *ok = self->host_hash == peer->host_hash;
  return epSuccess;
}

epResult_t shmRegMem(void* vctx, size_t size, int kind, void** ptr, void* handle, void** mem) {
  auto* ctx = static_cast<ShmContext*>(vctx);
  if (kind != EP_TRANSPORT_MEM_HOST) return epNotSupported;
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  auto* m = new (std::nothrow) ShmMem();
  if (m == nullptr) return epOutOfMemory;
  snprintf(m->path, sizeof(m->path), "%s/moeep-%d-%u-%08x", ctx->dir, int(getpid()),
           counter.fetch_add(1), unsigned(rd()));
  int fd = open(m->path, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    SHM_LOG(ctx, epTransportLogWarn, "cannot create %s: %s", m->path, strerror(errno));
    delete m;
    return epSystemError;
  }
  int err = posix_fallocate(fd, 0, off_t(size));
  if (err != 0) {
    SHM_LOG(ctx, epTransportLogWarn, "cannot reserve %zu bytes in %s: %s (is %s full?)", size,
            m->path, strerror(err), ctx->dir);
    close(fd);
    unlink(m->path);
    delete m;
    return err == ENOSPC ? epOutOfMemory : epSystemError;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    SHM_LOG(ctx, epTransportLogWarn, "mmap of %zu bytes failed: %s", size, strerror(errno));
    unlink(m->path);
    delete m;
    return epSystemError;
  }
  m->ptr = p;
  m->size = size;
  m->linked = true;
  ShmHandle h{};
  h.magic = kHandleMagic;
  h.size = size;
  snprintf(h.path, sizeof(h.path), "%s", m->path);
  memcpy(handle, &h, sizeof(h));
  *ptr = p;
  *mem = m;
  return epSuccess;
}

epResult_t shmDeregMem(void*, void* vmem) {
  auto* m = static_cast<ShmMem*>(vmem);
  if (m == nullptr) return epSuccess;
  munmap(m->ptr, m->size);
  if (m->linked) unlink(m->path);
  delete m;
  return epSuccess;
}

epResult_t shmConnect(void* vctx, const epPeerInfo_v1_t* peer, const void* peer_handle, void** ptr,
                      void** conn) {
  auto* ctx = static_cast<ShmContext*>(vctx);
  ShmHandle h;
  memcpy(&h, peer_handle, sizeof(h));
  if (h.magic != kHandleMagic) {
    SHM_LOG(ctx, epTransportLogWarn, "rank %d sent a handle that is not an shm handle", peer->rank);
    return epInternalError;
  }
  h.path[sizeof(h.path) - 1] = '\0';
  int fd = open(h.path, O_RDWR);
  if (fd < 0) {
    SHM_LOG(ctx, epTransportLogWarn, "cannot open rank %d's segment %s: %s", peer->rank, h.path,
            strerror(errno));
    return epSystemError;
  }
  void* p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    SHM_LOG(ctx, epTransportLogWarn, "cannot map rank %d's segment: %s", peer->rank, strerror(errno));
    return epSystemError;
  }
  auto* c = new (std::nothrow) ShmConn{p, size_t(h.size)};
  if (c == nullptr) {
    munmap(p, h.size);
    return epOutOfMemory;
  }
  *ptr = p;
  *conn = c;
  return epSuccess;
}

epResult_t shmConnected(void*, void* vmem) {
  auto* m = static_cast<ShmMem*>(vmem);
  if (m->linked) {
    unlink(m->path);
    m->linked = false;
  }
  return epSuccess;
}

epResult_t shmClose(void*, void* vconn) {
  auto* c = static_cast<ShmConn*>(vconn);
  if (c == nullptr) return epSuccess;
  munmap(c->ptr, c->size);
  delete c;
  return epSuccess;
}

epResult_t shmFinalize(void* vctx) {
  delete static_cast<ShmContext*>(vctx);
  return epSuccess;
}

const epTransport_v1_t shmTransport = {
    "shm",        1,                         shmInit,    shmProperties, shmCanConnect,
    shmRegMem,    shmDeregMem,              shmConnect, shmConnected,  nullptr,
    nullptr,      shmClose,                 shmFinalize};

}  // namespace

EP_TRANSPORT_DEFINE(shmTransport)
