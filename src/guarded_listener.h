// A listening socket that no stranger can stall or join: the one way the
// library listens on the network (the bootstrap root, each rank's ring
// listener, and the listeners the network transports add; docs/ARCHITECTURE.md,
// "Listening sockets").
//
// Every accepted connection gets a fresh challenge at once and must return a
// valid hello (src/handshake.h) within EP_BOOTSTRAP_HELLO_MS of its accept,
// or it is dropped. Connections are served from one poll loop, none ever
// waited on alone, so a silent, slow or garbled connection costs the owner
// nothing but its descriptor; at most kMaxPending wait at once (past that the
// oldest one that had kEvictGraceMs to answer makes room), so a flood cannot
// take the descriptors the real peers need. Only a hello made with the job's
// key, answering this connection's challenge, for this job and purpose, is
// handed to the owner, who acts on its payload. Every refusal is logged at
// WARN with the stranger's address and why (the first kLoggedRefusals one by
// one, then their count when the listener closes).
#pragma once

#include <poll.h>
#include <sys/resource.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "bootstrap_auth.h"
#include "fork_closed_fd.h"
#include "handshake.h"
#include "moeep.h"
#include "socket.h"

namespace ep {

// Raises the soft limit on open files to at least `want`, as far as the hard
// limit allows (distributions default to a soft limit far below the hard
// one). True when the limit rose.
bool raiseFdLimit(rlim_t want);
// The soft limit on open files; RLIM_INFINITY when unknown.
rlim_t softFdLimit();
// "1024, hard limit 4096", for messages.
std::string fdLimitText();

// EP_BOOTSTRAP_HELLO_MS, clamped to its documented range.
int helloTimeoutMs();

struct ListenerOptions {
  std::string name;  // for the log: "bootstrap root", "rank 3's ring listener"
  BootstrapKey key;
  uint64_t job = 0;
  uint16_t purpose = 0;
  size_t max_payload = hs::kMaxPayload;
  int hello_ms = 5000;
  // Said to a peer of another job (same key, another id): the likely cause.
  std::string other_job_text = "it belongs to another job (another unique id)";
};

// A peer whose hello verified: its connection, address and payload, and the
// nonces its reply must be sealed with.
struct VerifiedPeer {
  ForkClosedFd fd;
  SocketAddress addr;
  std::vector<uint8_t> payload;
  uint8_t server_nonce[hs::kNonceBytes] = {};
  uint8_t client_nonce[hs::kNonceBytes] = {};
};

class GuardedListener {
 public:
  // How many connections may wait for their hello at once.
  static constexpr size_t kMaxPending = 256;
  // A full pending set drops its oldest connection only once it had this long
  // to answer: a real peer answers its challenge within a round trip, and a
  // burst of real peers must not push each other out.
  static constexpr int kEvictGraceMs = 200;
  // After a failed accept (out of descriptors) the listener is left alone this
  // long: the connection stays in the backlog, and polling again at once would spin.
  static constexpr int kAcceptBackoffMs = 100;
  static constexpr int kLoggedRefusals = 16;

  explicit GuardedListener(ListenerOptions options);
  ~GuardedListener();
  GuardedListener(const GuardedListener&) = delete;
  GuardedListener& operator=(const GuardedListener&) = delete;

  // Binds (SO_REUSEADDR) and listens; *bound (may be NULL) gets the real address.
  bool listen(const SocketAddress& bind_addr, SocketAddress* bound, std::string* error);
  bool listening() const { return listen_fd_.valid(); }
  // Closes the listener and every connection still pending (logged at WARN);
  // verified peers not taken yet are closed too.
  void close();

  // One poll loop may serve the listener beside other sockets: addPollFds
  // appends its entries (the listener, unless paused, and each pending
  // connection) and returns how many; after poll(), handlePollFds takes those
  // entries back (a pointer to the first). Deadlines pass in handlePollFds too.
  size_t addPollFds(std::vector<pollfd>* fds);
  void handlePollFds(const pollfd* fds);
  // How long poll() may sleep before a deadline of this listener (at most cap_ms).
  int pollTimeoutMs(int cap_ms) const;
  // The next verified peer, oldest first. False when there is none.
  bool takeVerified(VerifiedPeer* out);

  // Waits for the next verified peer by itself (kTimeout / kAborted when the
  // wait ends first, kError when the listener failed).
  IoResult acceptVerified(const Wait& wait, VerifiedPeer* out);

  // The signed reply to a verified peer: status epSuccess with the purpose's
  // payload, or an error with its reason.
  IoResult reply(const VerifiedPeer& peer, epResult_t status, const void* payload, size_t len,
                 const Wait& wait) const;
  // Refuses a peer that verified but is not welcome (a rank that is not the
  // one expected): logged at WARN, told why, closed.
  void refuse(VerifiedPeer* peer, epResult_t status, const std::string& why);

  // Descriptors the owner expects to need besides the pending set (the root:
  // one per rank still to come); an accept out of descriptors raises the
  // soft limit by that much where it can.
  void setFdsWanted(rlim_t n) { fds_wanted_ = n; }
  // EMFILE or ENFILE once an accept ran out of descriptors, else 0.
  int outOfFdsErrno() const { return fd_errno_; }
  size_t pendingCount() const { return pending_.size(); }
  const std::string& name() const { return options_.name; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    ForkClosedFd fd;
    SocketAddress addr;
    Clock::time_point accepted;
    uint8_t nonce[hs::kNonceBytes] = {};
    std::vector<uint8_t> in;
    size_t want = sizeof(hs::HelloHead);
    bool head_checked = false;
  };

  void acceptBurst();
  bool makeRoom(Clock::time_point now);
  bool acceptFailed(const IoResult& r);
  // Reads what p sent; true while p stays pending.
  bool readHello(Pending* p);
  bool finishHello(Pending* p);
  void drop(Pending* p, const std::string& why, bool tell);
  void expire(Clock::time_point now);
  void logRefusal(const SocketAddress& addr, const std::string& why);

  ListenerOptions options_;
  ForkClosedFd listen_fd_;
  SocketAddress address_;
  std::vector<Pending> pending_;
  std::deque<VerifiedPeer> verified_;
  size_t polled_pending_ = 0;  // pending entries of the last addPollFds
  bool polled_listener_ = false;
  Clock::time_point accept_paused_until_ = Clock::time_point::min();
  rlim_t fds_wanted_ = 0;
  int fd_errno_ = 0;
  int refusals_logged_ = 0;
  long refusals_unlogged_ = 0;
};

}  // namespace ep
