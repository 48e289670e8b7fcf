// The data plane: put and test on the caller's thread, and a thread per
// communicator that writes what put could not and receives every frame.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "socket.h"

namespace epsock {

namespace {

void wake(Comm* c) {
  const uint64_t one = 1;
  ssize_t rc = write(c->wake_fd, &one, sizeof(one));
  (void)rc;  // a full counter already wakes the thread
}

// After a round of the thread that moved something: wakes a caller asleep in
// wait. The count moves after what the round stored (signals, data), so a
// caller that sees it move sees those too.
void wakeWaiters(Comm* c) {
  c->events.fetch_add(1);
  if (c->sleepers.load() > 0) {
    std::lock_guard<std::mutex> l(c->wait_mu);
    c->wait_cv.notify_all();
  }
}

// A frame's put is done once all its frames are written; puts retire in order.
void frameWritten(Conn* k, uint64_t put_id) {
  if (put_id == kNoPut) return;
  k->puts[size_t(put_id - k->first_put)]--;
  while (!k->puts.empty() && k->puts.front() == 0) {
    k->puts.pop_front();
    k->first_put++;
  }
}

// Frames that will never be written (the peer left) complete as dropped.
void dropQueued(Conn* k) {
  for (TxStream& s : k->tx) {
    for (const Frame& f : s.queue) frameWritten(k, f.put_id);
    s.queue.clear();
  }
}

// Under send_mu. A failed send is only an error if the peer did not close in
// order: its goodbye may still be unread on the receiving side, so the
// verdict waits for that side (or kBrokenSendGraceMs).
void sendFailed(Conn* k, size_t stream, int err) {
  if (!k->goodbye && !k->tx_broken) {
    k->tx_broken = true;
    k->tx_broken_at = Clock::now();
    k->tx_error = "send on stream " + std::to_string(stream) + " failed: " + strerror(err);
    if (err == EPIPE || err == ECONNRESET) k->tx_error += " without a goodbye: its process exited or failed";
  }
  dropQueued(k);
}

// Under send_mu: writes what stream s takes now, several frames per call.
void flushStream(Conn* k, size_t stream) {
  TxStream& s = k->tx[stream];
  constexpr int kIov = 64;
  while (!s.queue.empty() && !k->tx_broken) {
    iovec iov[kIov];
    int n = 0;
    for (size_t i = 0; i < s.queue.size() && n + 2 <= kIov; i++) {
      Frame& f = s.queue[i];
      if (f.sent < sizeof(WireFrame))
        iov[n++] = {reinterpret_cast<uint8_t*>(&f.hdr) + f.sent, sizeof(WireFrame) - f.sent};
      const size_t data_sent = f.sent > sizeof(WireFrame) ? f.sent - sizeof(WireFrame) : 0;
      if (f.hdr.bytes > data_sent) iov[n++] = {const_cast<uint8_t*>(f.data) + data_sent, f.hdr.bytes - data_sent};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(n);
    ssize_t w = sendmsg(s.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) sendFailed(k, stream, errno);
      return;
    }
    while (w > 0) {
      Frame& f = s.queue.front();
      const size_t take = std::min(size_t(w), sizeof(WireFrame) + f.hdr.bytes - f.sent);
      f.sent += take;
      w -= ssize_t(take);
      if (f.sent == sizeof(WireFrame) + f.hdr.bytes) {
        frameWritten(k, f.put_id);
        s.queue.pop_front();
      }
    }
  }
}

Mem* findMem(Comm* c, uint32_t id) {
  return id >= 1 && id <= c->mems.size() ? c->mems[id - 1] : nullptr;
}

// Checks a frame header against what this rank registered.
bool frameOk(Comm* c, Conn* k, const WireFrame& h, std::string* why) {
  char msg[160];
  if (h.magic != kFrameMagic) {
    snprintf(msg, sizeof(msg), "bad frame: magic 0x%08x", h.magic);
  } else if (h.seq != k->rx_seq) {
    snprintf(msg, sizeof(msg), "bad frame: number %llu where %llu was due", (unsigned long long)h.seq,
             (unsigned long long)k->rx_seq);
  } else if (h.type == kFrameGoodbye) {
    return true;
  } else if (h.type != kFrameData || (h.flags & ~kFrameSignal) != 0) {
    snprintf(msg, sizeof(msg), "bad frame: type %u, flags 0x%x", h.type, h.flags);
  } else if (Mem* m = findMem(c, h.mem_id)) {
    if (h.offset > m->bytes || h.bytes > m->bytes - h.offset)
      snprintf(msg, sizeof(msg), "bad frame: %llu bytes at %llu past the %zu bytes of memory %u",
               (unsigned long long)h.bytes, (unsigned long long)h.offset, m->bytes, h.mem_id);
    else if ((h.flags & kFrameSignal) && (h.signal_offset % 8 != 0 || h.signal_offset > m->bytes - 8))
      snprintf(msg, sizeof(msg), "bad frame: signal at %llu of the %zu bytes of memory %u",
               (unsigned long long)h.signal_offset, m->bytes, h.mem_id);
    else
      return true;
  } else {
    snprintf(msg, sizeof(msg), "bad frame: memory %u is not registered", h.mem_id);
  }
  *why = msg;
  return false;
}

// The connection ended on stream i (n == 0: closed; else errno).
void rxEnded(Conn* k, size_t i, ssize_t n, int err) {
  k->rx_done = true;
  if (k->goodbye) return;
  std::string how = n == 0 ? "closed the connection" : std::string("connection error (") + strerror(err) + ")";
  if (k->have_header)
    failConn(k, "%s mid-frame on stream %zu (%llu of %llu bytes landed): its process exited or failed",
             how.c_str(), i, (unsigned long long)k->cur_got, (unsigned long long)k->cur.bytes);
  else
    failConn(k, "%s on stream %zu without a goodbye: its process exited or failed", how.c_str(), i);
}

// Reads at most want bytes of stream s into dst: 1 with *n > 0 bytes, 0 when
// nothing is there now (back to poll), -1 when the stream ended (*n: recv's
// result, errno kept). A read shorter than asked means the socket is empty
// for now: the next read of the same call goes back to poll instead of
// costing a recv that would say EAGAIN.
int readStream(RxStream& s, void* dst, size_t want, ssize_t* n) {
  if (s.drained) return 0;
  *n = recv(s.fd, dst, want, MSG_DONTWAIT);
  if (*n > 0) {
    s.drained = size_t(*n) < want;
    return 1;
  }
  if (*n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  return -1;
}

// Under recv_mu: takes frames in number order until the due stream has
// nothing more (or a budget is spent, so that close never waits long).
void receive(Comm* c, Conn* k) {
  size_t budget = size_t(32) << 20;
  k->rx_more = false;
  for (RxStream& s : k->rx) s.drained = false;  // poll said the due stream has bytes
  while (!k->rx_done && !k->failed) {
    if (budget == 0) {
      k->rx_more = true;
      return;
    }
    const size_t i = size_t(k->rx_seq % k->rx.size());
    RxStream& s = k->rx[i];
    ssize_t n = 0;
    if (!k->have_header) {
      if (s.end - s.pos < sizeof(WireFrame)) {
        memmove(s.stage.data(), s.stage.data() + s.pos, s.end - s.pos);
        s.end -= s.pos;
        s.pos = 0;
        // After a large frame the next is likely large too: read its header
        // alone, so that its data goes straight to memory, not via the stage.
        const size_t want = s.large ? sizeof(WireFrame) - s.end : s.stage.size() - s.end;
        const int rc = readStream(s, s.stage.data() + s.end, want, &n);
        if (rc == 0) return;
        if (rc < 0) return rxEnded(k, i, n, errno);
        s.end += size_t(n);
        budget -= std::min(budget, size_t(n));
        continue;
      }
      memcpy(&k->cur, s.stage.data() + s.pos, sizeof(WireFrame));
      s.pos += sizeof(WireFrame);
      std::string why;
      if (!frameOk(c, k, k->cur, &why)) {
        k->rx_done = true;
        failConn(k, "%s (stream %zu)", why.c_str(), i);
        return;
      }
      if (k->cur.type == kFrameGoodbye) {
        k->goodbye = true;
        k->rx_done = true;
        return;
      }
      k->have_header = true;
      k->cur_got = 0;
      s.large = k->cur.bytes >= kStageBytes;
    }
    Mem* m = findMem(c, k->cur.mem_id);
    if (m == nullptr) {  // deregistered while the frame came
      k->rx_done = true;
      failConn(k, "a frame for memory %u, deregistered meanwhile", k->cur.mem_id);
      return;
    }
    uint8_t* dst = static_cast<uint8_t*>(m->ptr) + k->cur.offset;
    const size_t staged = std::min<size_t>(s.end - s.pos, k->cur.bytes - k->cur_got);
    memcpy(dst + k->cur_got, s.stage.data() + s.pos, staged);
    s.pos += staged;
    k->cur_got += staged;
    while (k->cur_got < k->cur.bytes) {  // the rest straight into the memory
      const int rc = readStream(s, dst + k->cur_got, k->cur.bytes - k->cur_got, &n);
      if (rc == 0) return;
      if (rc < 0) return rxEnded(k, i, n, errno);
      k->cur_got += uint64_t(n);
      budget -= std::min(budget, size_t(n));
    }
    // The bytes above were written by this thread (recv copies in its
    // context): the release store orders them before the signal.
    if (k->cur.flags & kFrameSignal)
      __atomic_store_n(reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(m->ptr) + k->cur.signal_offset),
                       k->cur.signal_value, __ATOMIC_RELEASE);
    k->have_header = false;
    k->rx_seq++;
  }
}

void ioLoop(Comm* c) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Conn*, int>> who;  // stream -1: the receiving side
  std::vector<Conn*> more;
  for (;;) {
    fds.assign(1, pollfd{c->wake_fd, POLLIN, 0});
    who.assign(1, {nullptr, 0});
    more.clear();
    {
      std::lock_guard<std::mutex> rl(c->recv_mu);
      if (c->stop) return;
      c->io_gen = c->gen;  // conns closed before now are out of this round
      c->io_cv.notify_all();
      std::lock_guard<std::mutex> sl(c->send_mu);
      for (Conn* k : c->conns) {
        if (k->closing) continue;
        if (!k->rx_done && !k->failed) {
          if (k->rx_more) more.push_back(k);
          fds.push_back({k->rx[size_t(k->rx_seq % k->rx.size())].fd, POLLIN, 0});
          who.push_back({k, -1});
        }
        if (k->tx_broken && !k->goodbye && !k->failed &&
            Clock::now() - k->tx_broken_at > std::chrono::milliseconds(kBrokenSendGraceMs))
          failConn(k, "%s", k->tx_error.c_str());
        for (size_t i = 0; i < k->tx.size(); i++)
          if (!k->tx[i].queue.empty()) {
            fds.push_back({k->tx[i].fd, POLLOUT, 0});
            who.push_back({k, int(i)});
          }
      }
    }
    if (poll(fds.data(), fds.size(), more.empty() ? 100 : 0) < 0 && errno != EINTR) {
      // Only a bad descriptor set can get here: nothing to wait on would spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (fds[0].revents) {
      uint64_t count;
      ssize_t rc = read(c->wake_fd, &count, sizeof(count));
      (void)rc;
    }
    bool moved = !more.empty();
    for (size_t i = 1; i < fds.size(); i++) {
      if (fds[i].revents == 0) continue;
      moved = true;
      Conn* k = who[i].first;
      if (who[i].second < 0) {
        std::lock_guard<std::mutex> rl(c->recv_mu);
        if (!k->closing) receive(c, k);
        more.erase(std::remove(more.begin(), more.end(), k), more.end());
      } else {
        std::lock_guard<std::mutex> sl(c->send_mu);
        if (!k->closing) flushStream(k, size_t(who[i].second));
      }
    }
    for (Conn* k : more) {
      std::lock_guard<std::mutex> rl(c->recv_mu);
      if (!k->closing) receive(c, k);
    }
    if (!moved) {
      std::lock_guard<std::mutex> el(c->err_mu);
      moved = c->broken;  // a verdict of this round (a send's grace ran out)
    }
    if (moved) wakeWaiters(c);
  }
}

}  // namespace

void failConn(Conn* k, const char* fmt, ...) {
  if (k->failed.exchange(true)) return;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  Comm* c = k->comm;
  // The error first, then the mark: a caller that sees the communicator
  // broken (progress, wait) must find the reason in last_error.
  c->fail(epRemoteError, k->peer, "%s: %s", k->where.c_str(), msg);
  std::lock_guard<std::mutex> el(c->err_mu);
  c->broken = true;
}

epResult_t startIo(Comm* c) {
  c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->wake_fd < 0) return c->fail(epSystemError, -1, "eventfd: %s", strerror(errno));
  try {
    c->io = std::thread(ioLoop, c);
  } catch (const std::exception& e) {
    return c->fail(epSystemError, -1, "cannot start the communicator's thread: %s", e.what());
  }
  return epSuccess;
}

void stopIo(Comm* c) {
  if (c->io.joinable()) {
    {
      std::lock_guard<std::mutex> rl(c->recv_mu);
      c->stop = true;
    }
    wake(c);
    c->io.join();
  }
  closeFd(&c->wake_fd);
}

void addConn(Comm* c, Conn* k) {
  {
    std::lock_guard<std::mutex> rl(c->recv_mu);
    std::lock_guard<std::mutex> sl(c->send_mu);
    c->conns.push_back(k);
  }
  wake(c);
}

void closeConn(Comm* c, Conn* k) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
  // Whatever was posted still goes out (a caller may close right after its
  // last put), then the goodbye, which tells the peer to expect nothing more.
  {
    std::lock_guard<std::mutex> sl(c->send_mu);
    if (!k->failed && !k->tx_broken && !k->goodbye && !k->tx.empty()) {
      Frame f{};
      f.hdr.magic = kFrameMagic;
      f.hdr.type = kFrameGoodbye;
      f.hdr.seq = k->tx_seq++;
      f.put_id = kNoPut;
      k->tx[size_t(f.hdr.seq % k->tx.size())].queue.push_back(f);
    }
  }
  for (;;) {
    std::vector<pollfd> fds;
    {
      std::lock_guard<std::mutex> sl(c->send_mu);
      if (k->failed || k->tx_broken || k->goodbye) dropQueued(k);
      for (size_t i = 0; i < k->tx.size(); i++) {
        flushStream(k, i);
        if (!k->tx[i].queue.empty()) fds.push_back({k->tx[i].fd, POLLOUT, 0});
      }
    }
    if (fds.empty() || msLeft(deadline) == 0) break;
    poll(fds.data(), fds.size(), std::min(msLeft(deadline), 50));
  }
  // Out of the thread's set: once its round built after this began, it no
  // longer touches k.
  {
    std::unique_lock<std::mutex> rl(c->recv_mu);
    {
      std::lock_guard<std::mutex> sl(c->send_mu);
      k->closing = true;
      c->conns.erase(std::remove(c->conns.begin(), c->conns.end(), k), c->conns.end());
    }
    const uint64_t gen = ++c->gen;
    if (c->io.joinable() && !c->stop) {
      wake(c);
      c->io_cv.wait(rl, [&] { return c->io_gen >= gen || c->stop; });
    }
  }
  for (TxStream& s : k->tx) {
    shutdown(s.fd, SHUT_WR);  // the peer reads all, then the end
    closeFd(&s.fd);
  }
  for (RxStream& s : k->rx) closeFd(&s.fd);
  delete k;
}

epResult_t put(void* conn, void* mem, size_t offset, const void* remote_handle, size_t remote_offset, size_t bytes,
               size_t signal_offset, uint64_t signal_value, unsigned flags, uint64_t* request) {
  auto* k = static_cast<Conn*>(conn);
  auto* m = static_cast<Mem*>(mem);
  if (k == nullptr || remote_handle == nullptr || (bytes > 0 && m == nullptr)) return epInvalidArgument;
  Comm* c = k->comm;
  WireMemHandle h;
  memcpy(&h, remote_handle, sizeof(h));
  const bool signal = (flags & EP_PUT_SIGNAL) != 0;
  if (h.magic != kMemMagic || h.nonce != k->peer_nonce)
    return c->fail(epInvalidArgument, k->peer, "put to %s: the remote handle is not one of its memories",
                   k->where.c_str());
  if (bytes > 0 && (offset > m->bytes || bytes > m->bytes - offset))
    return c->fail(epInvalidArgument, k->peer, "put to %s: %zu bytes at %zu past the %zu registered here",
                   k->where.c_str(), bytes, offset, m->bytes);
  if (remote_offset > h.bytes || bytes > h.bytes - remote_offset)
    return c->fail(epInvalidArgument, k->peer, "put to %s: %zu bytes at %zu past its %llu registered bytes",
                   k->where.c_str(), bytes, remote_offset, (unsigned long long)h.bytes);
  if (signal && (signal_offset % 8 != 0 || h.bytes < 8 || signal_offset > h.bytes - 8))
    return c->fail(epInvalidArgument, k->peer, "put to %s: signal at %zu (8-byte aligned, within %llu bytes)",
                   k->where.c_str(), signal_offset, (unsigned long long)h.bytes);
  if (!signal && bytes == 0) {
    if (request) *request = kNoPut;  // nothing to do; test says done
    return epSuccess;
  }

  bool need_wake = false;
  {
    std::lock_guard<std::mutex> sl(c->send_mu);
    if (k->failed) return epRemoteError;
    const uint64_t id = k->first_put + k->puts.size();
    if (k->goodbye) {  // the peer takes nothing more: done at once
      if (k->puts.empty())
        k->first_put++;
      else
        k->puts.push_back(0);
      if (request) *request = id;
      return epSuccess;
    }
    if (k->tx_broken) return epInProgress;  // the verdict comes within the grace
    if (k->puts.size() >= kMaxPutsInFlight) return epInProgress;
    const size_t parts = bytes == 0 ? 1 : (bytes + kPartBytes - 1) / kPartBytes;
    k->puts.push_back(uint32_t(parts));
    bool touched[kMaxStreams] = {};
    bool was_empty[kMaxStreams];
    for (size_t i = 0; i < k->tx.size(); i++) was_empty[i] = k->tx[i].queue.empty();
    const uint8_t* local = bytes > 0 ? static_cast<const uint8_t*>(m->ptr) + offset : nullptr;
    for (size_t p = 0; p < parts; p++) {
      Frame f{};
      const size_t at = p * kPartBytes;
      f.hdr.magic = kFrameMagic;
      f.hdr.type = kFrameData;
      f.hdr.flags = (signal && p + 1 == parts) ? kFrameSignal : 0;
      f.hdr.seq = k->tx_seq++;
      f.hdr.mem_id = h.mem_id;
      f.hdr.offset = remote_offset + at;
      f.hdr.bytes = std::min(kPartBytes, bytes - std::min(bytes, at));
      f.hdr.signal_offset = signal_offset;
      f.hdr.signal_value = signal_value;
      f.data = local ? local + at : nullptr;
      f.put_id = id;
      const size_t s = size_t(f.hdr.seq % k->tx.size());
      k->tx[s].queue.push_back(f);
      touched[s] = true;
    }
    for (size_t i = 0; i < k->tx.size(); i++) {
      if (!touched[i]) continue;
      flushStream(k, i);
      // A stream that had nothing queued may be missing from the thread's
      // poll set: it must look again.
      if (was_empty[i] && !k->tx[i].queue.empty()) need_wake = true;
    }
    if (request) *request = id;
  }
  if (need_wake) wake(c);
  return epSuccess;
}

epResult_t test(void* conn, uint64_t request, int* done) {
  auto* k = static_cast<Conn*>(conn);
  if (k == nullptr || done == nullptr) return epInvalidArgument;
  std::lock_guard<std::mutex> sl(k->comm->send_mu);
  if (k->failed) return epRemoteError;
  if (request == kNoPut || request < k->first_put) {
    *done = 1;
    return epSuccess;
  }
  const uint64_t index = request - k->first_put;
  if (index >= k->puts.size()) return epInvalidArgument;  // never posted
  *done = k->puts[size_t(index)] == 0;
  return epSuccess;
}

epResult_t progress(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  std::lock_guard<std::mutex> el(c->err_mu);
  return c->broken ? epRemoteError : epSuccess;
}

epResult_t dropPeer(void* comm, int peer) {
  auto* c = static_cast<Comm*>(comm);
  // Its connections count as failed (their close flushes nothing), and the
  // communicator is broken only by the others'. err_mu inside recv_mu: a
  // failure of another connection cannot fall between the look and the reset.
  std::lock_guard<std::mutex> rl(c->recv_mu);
  bool others_failed = false;
  for (Conn* k : c->conns) {
    if (k->peer == peer) k->failed.store(true);
    else if (k->failed) others_failed = true;
  }
  std::lock_guard<std::mutex> el(c->err_mu);
  if (!others_failed) c->broken = false;
  if (c->err_peer == peer) {  // last_error names someone else's failure, or none
    c->err_peer = -1;
    c->err_msg.clear();
  }
  return epSuccess;
}

epResult_t wait(void* comm, int timeout_us) {
  auto* c = static_cast<Comm*>(comm);
  if (c->events.load() == c->wait_seen) {
    // sleepers before events: the thread moves events before it reads
    // sleepers, so one of the two sees the other.
    c->sleepers.fetch_add(1);
    {
      std::unique_lock<std::mutex> l(c->wait_mu);
      c->wait_cv.wait_for(l, std::chrono::microseconds(std::max(timeout_us, 0)),
                          [c] { return c->events.load() != c->wait_seen; });
    }
    c->sleepers.fetch_sub(1);
  }
  c->wait_seen = c->events.load();
  return progress(comm);
}

}  // namespace epsock
