// Bootstrap: the unique id, and a rank's way into the job: the root, then
// the TCP ring for allgather and barrier (bootstrap_ring.cc).
//
// Every connection opens with the authenticated hello of src/handshake.h,
// made with the job's key from the unique id, and every listening socket is
// a GuardedListener (src/guarded_listener.h):
//   rank -> root : hello (purpose root, RootHelloBody)   root -> rank : reply (address of rank (rank+1)%nranks)
//   rank -> next : hello (purpose ring, RingHelloBody)   next -> rank : reply (empty)
// then each collective exchanges an OpHeader with the neighbours first, so
// that ranks that call different collectives or sizes fail with a message
// instead of hanging. Structs are fixed-size, host byte order: every rank of
// a job runs the same build on the same architecture.
#include "bootstrap.h"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap_auth.h"
#include "bootstrap_ring.h"
#include "bootstrap_root.h"
#include "checks.h"
#include "debug.h"
#include "guarded_listener.h"
#include "handshake.h"
#include "params.h"
#include "socket.h"

namespace ep {

namespace {

using Clock = std::chrono::steady_clock;

// "moeepBS2": ids of this layout; "moeepBS1" ids (no key) came from an
// earlier library and are refused with that said.
constexpr char kIdMagic[8] = {'m', 'o', 'e', 'e', 'p', 'B', 'S', '2'};
constexpr char kOldIdMagic[8] = {'m', 'o', 'e', 'e', 'p', 'B', 'S', '1'};
constexpr uint32_t kIdAuthenticated = 1u;  // IdLayout::flags: the key is secret
// How much longer a rank waits for the root's reply than its own timeout: the
// root times out at the same moment and its reply (naming the missing ranks) is
// far more useful than "the root did not answer".
constexpr int kRootReplyGraceMs = 1000;
// Pause before dialling again a listener that dropped this rank's connection
// before its hello was through (a flood of strangers there, or a late hello).
constexpr int kRedialMs = 20;

// The unique id's content; the rest of the 128 bytes is zero. The key makes
// the id a secret: whoever holds it can join the job (docs/SEMANTICS.md).
struct IdLayout {
  char magic[8];
  uint64_t nonce;  // the job: tells jobs apart, not secret
  PackedAddress root;
  // 1: made from EP_COMM_ID on every rank; no root runs yet and rank 0 starts
  // it in bootstrapInit (how mpirun jobs share an id without MPI calls).
  uint32_t root_by_rank0;
  uint32_t flags;  // kIdAuthenticated
  uint8_t key[kBootstrapKeyBytes];
};
static_assert(sizeof(IdLayout) <= EP_UNIQUE_ID_BYTES, "unique id layout too large");

struct RingHelloBody {
  int32_t rank;
  int32_t nranks;
};

int clampMs(int64_t ms) { return int(std::min<int64_t>(std::max<int64_t>(ms, 0), INT_MAX)); }

// Timeout of one operation: the caller's, else EP_TIMEOUT_MS (<= 0: none).
int effectiveTimeoutMs(int timeout_ms) {
  return timeout_ms > 0 ? timeout_ms : clampMs(param::TIMEOUT_MS());
}

uint64_t freshNonce() {
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != ssize_t(sizeof(nonce))) {
    // No entropy yet (early boot): time and pid still tell two jobs apart.
    nonce = uint64_t(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull ^
            (uint64_t(getpid()) << 32);
  }
  return nonce != 0 ? nonce : 1;
}

BootstrapKey keyOf(const IdLayout& layout) {
  BootstrapKey key;
  memcpy(key.bytes, layout.key, sizeof(key.bytes));
  key.authenticated = (layout.flags & kIdAuthenticated) != 0;
  return key;
}

// The same nonce on every rank that reads the same EP_COMM_ID in the same
// launcher job: the job id the launcher gives its ranks (Open MPI, PMIx,
// Slurm) is mixed in, so that the ranks of another job started on the same
// address by mistake are refused by the root instead of joining this job.
// The text is hashed without the blanks around it, which parseSocketAddress
// ignores too; names are not resolved (a name may resolve differently on
// another host), so every rank must write the address the same way.
uint64_t nonceOfCommId(const char* comm_id) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](const std::string& text) {
    for (char c : text) h = (h ^ uint8_t(c)) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;  // separator
  };
  std::string id = comm_id;
  const size_t first = id.find_first_not_of(" \t"), last = id.find_last_not_of(" \t");
  mix(first == std::string::npos ? "" : id.substr(first, last - first + 1));
  for (const char* var : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"}) {
    const char* job = getenv(var);
    if (job != nullptr && *job != '\0') {
      mix(var);
      mix(job);
    }
  }
  return h != 0 ? h : 1;
}

}  // namespace

epResult_t bootstrapGetUniqueId(epUniqueId* id, bool honour_comm_id) {
  if (id == nullptr) return setError(nullptr, epInvalidArgument, "bootstrap: unique id pointer is NULL");
  const int family = socketFamilyFromParam();
  const char* comm_id = honour_comm_id ? param::COMM_ID() : nullptr;
  SocketAddress bind_addr;
  std::string error, ifname;
  IdLayout layout;
  memset(&layout, 0, sizeof(layout));
  memcpy(layout.magic, kIdMagic, sizeof(kIdMagic));
  BootstrapKey key;
  if (comm_id != nullptr && *comm_id != '\0') {
    // Every rank derives the same id from EP_COMM_ID; rank 0 serves the root
    // there when it joins (bootstrapInit), so no rank needs to send the id.
    if (!parseSocketAddress(comm_id, family, &bind_addr, &error))
      return setError(nullptr, epInvalidArgument, "bootstrap: EP_COMM_ID: %s", error.c_str());
    if (bind_addr.isWildcard() || bind_addr.port() == 0)
      return setError(nullptr, epInvalidArgument,
                      "bootstrap: EP_COMM_ID=%s must name the address and port of rank 0's host", comm_id);
    if (!commSecretKey(&key, &error)) return setError(nullptr, epInvalidArgument, "bootstrap: %s", error.c_str());
    layout.nonce = nonceOfCommId(comm_id);
    layout.root_by_rank0 = 1;
    packAddress(bind_addr, &layout.root);
  } else {
    if (!findInterfaceAddress(param::SOCKET_IFNAME(), family, &bind_addr, &ifname, &error))
      return setError(nullptr, epSystemError, "bootstrap: %s", error.c_str());
    if (!randomBootstrapKey(&key, &error))
      return setError(nullptr, epSystemError, "bootstrap: cannot draw the job's secret: %s", error.c_str());
    layout.nonce = freshNonce();
    SocketAddress advertised;
    EPCHECK(startRoot(bind_addr, layout.nonce, key, &advertised));
    packAddress(advertised, &layout.root);
  }
  memcpy(layout.key, key.bytes, sizeof(layout.key));
  layout.flags = key.authenticated ? kIdAuthenticated : 0;
  secureZero(key.bytes, sizeof(key.bytes));
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, &layout, sizeof(layout));
  secureZero(&layout, sizeof(layout));
  return epSuccess;
}

bool bootstrapIdValid(const epUniqueId& id) {
  IdLayout layout;
  memcpy(&layout, id.internal, sizeof(layout));
  SocketAddress root;
  const bool valid = memcmp(layout.magic, kIdMagic, sizeof(kIdMagic)) == 0 && layout.nonce != 0 &&
                     unpackAddress(layout.root, &root) && root.port() != 0;
  secureZero(&layout, sizeof(layout));
  return valid;
}

namespace {

// The listening address of this rank: where the root connection left from,
// unless EP_SOCKET_IFNAME picks an interface explicitly.
bool chooseRankListenAddress(int root_fd, int root_family, SocketAddress* out, std::string* error) {
  const char* spec = param::SOCKET_IFNAME();
  if (spec != nullptr && *spec != '\0') {
    int family = socketFamilyFromParam();
    return findInterfaceAddress(spec, family != AF_UNSPEC ? family : root_family, out, nullptr, error);
  }
  if (!localAddress(root_fd, out)) {
    *error = std::string("getsockname failed: ") + strerror(errno);
    return false;
  }
  out->setPort(0);
  return true;
}

// A failed step of bootstrapInit; `what` names the step and the peer.
epResult_t ioFailure(epComm* comm, const IoResult& r, int rank, const std::string& what, int timeout_ms) {
  switch (r.status) {
    case IoStatus::kOk: return epSuccess;
    case IoStatus::kTimeout:
      return setError(comm, epTimeout, "bootstrap: rank %d: %s within %d ms", rank, what.c_str(), timeout_ms);
    case IoStatus::kAborted:
      return setError(comm, epAborted, "bootstrap: rank %d: aborted (%s)", rank, what.c_str());
    case IoStatus::kClosed:
      return setError(comm, epRemoteError, "bootstrap: rank %d: %s: %s", rank, what.c_str(), r.describe().c_str());
    case IoStatus::kError:
      return setError(comm, epSystemError, "bootstrap: rank %d: %s: %s", rank, what.c_str(), r.describe().c_str());
  }
  return epInternalError;
}

std::string rankText(int rank, const char* rest) { return "rank " + std::to_string(rank) + rest; }

// An epResult_t from a peer's reply, which may not be one.
epResult_t resultOf(int32_t status) {
  return status >= int(epUnhandledCudaError) && status <= int(epOutOfMemory) ? epResult_t(status) : epInternalError;
}

std::string textOf(const std::vector<uint8_t>& payload) {
  std::string s(payload.begin(), payload.end());
  s.erase(std::find(s.begin(), s.end(), '\0'), s.end());
  for (char& c : s)
    if (c < 0x20 || c == 0x7f) c = '?';  // the text of a peer that may not hold the key
  return s;
}

// Connects to the ring successor and accepts the predecessor, both at once
// (each rank's successor does the same, so neither side may wait for the
// other first). Anything else that dials this rank's port (a stale rank of an
// earlier run, a port scanner) is the listener's to refuse. The successor's
// listener may drop this rank's connection before its hello is through (a
// flood of strangers there): then it dials again, within its wait.
epResult_t joinRing(Bootstrap* b, GuardedListener* listener, const SocketAddress& next_addr, const Wait& wait) {
  const int timeout = b->timeout_ms;
  const RingHelloBody body = {b->rank, b->nranks};
  hs::ClientHandshake next;
  bool have_next = false;
  std::vector<pollfd> fds;
  bool dial = true;
  for (;;) {
    if (dial) {
      dial = false;
      const IoResult r = connectWithRetry(next_addr, wait, &b->next_fd);
      if (!r.ok())
        return ioFailure(b->comm, r, b->rank,
                         "could not connect to " + rankText(b->next(), " (ring successor at ") +
                             next_addr.toString() + ", " + r.describe() + ")",
                         timeout);
      next.start(b->next_fd.get(), b->key, b->nonce, hs::kPurposeRing, &body, sizeof(body));
    }
    if (!have_next) {
      using State = hs::ClientHandshake::State;
      using Failure = hs::ClientHandshake::Failure;
      const State s = next.advance();
      if (s == State::kFailed && next.failure == Failure::kDropped && !wait.expired()) {
        b->next_fd.reset();
        std::this_thread::sleep_for(std::chrono::milliseconds(kRedialMs));
        dial = true;
        continue;
      }
      if (s == State::kFailed)
        return setError(b->comm, next.failure == Failure::kIo ? epSystemError : epRemoteError,
                        "bootstrap: rank %d: rank %d (ring successor at %s) did not take its hello: %s", b->rank,
                        b->next(), next_addr.toString().c_str(),
                        next.failure == Failure::kIo ? next.io.describe().c_str()
                        : next.why.empty()           ? "it closed the connection"
                                                     : next.why.c_str());
      if (s == State::kDone && next.status != epSuccess)
        return setError(b->comm, resultOf(next.status), "bootstrap: rank %d: rank %d (ring successor at %s) refused it%s: %s",
                        b->rank, b->next(), next_addr.toString().c_str(),
                        next.authentic ? "" : " (an unauthenticated refusal)", textOf(next.reply_payload).c_str());
      have_next = s == State::kDone;
    }
    VerifiedPeer peer;
    while (!b->prev_fd.valid() && listener->takeVerified(&peer)) {
      RingHelloBody got = {-1, -1};
      if (peer.payload.size() == sizeof(got)) memcpy(&got, peer.payload.data(), sizeof(got));
      if (got.rank != b->prev() || got.nranks != b->nranks) {
        // It holds the job's key: a rank of this job that dialled the wrong port.
        listener->refuse(&peer, epInvalidUsage,
                         "it says it is rank " + std::to_string(got.rank) + " of " + std::to_string(got.nranks) +
                             ", not rank " + std::to_string(b->prev()) + " of " + std::to_string(b->nranks) +
                             " (this rank's ring predecessor)");
        continue;
      }
      const IoResult r = listener->reply(peer, epSuccess, nullptr, 0, wait);
      if (!r.ok())
        return ioFailure(b->comm, r, b->rank, "answering " + rankText(b->prev(), " (ring predecessor)"), timeout);
      b->prev_fd = peer.fd.release();
      // Nobody else may join now: later dialers are refused by the kernel.
      listener->close();
    }
    if (have_next && b->prev_fd.valid()) return epSuccess;
    if (wait.aborted() || wait.expired()) {
      IoResult end;
      end.status = wait.aborted() ? IoStatus::kAborted : IoStatus::kTimeout;
      return b->prev_fd.valid()
                 ? ioFailure(b->comm, end, b->rank, rankText(b->next(), " (ring successor) did not answer its hello"),
                             timeout)
                 : ioFailure(b->comm, end, b->rank, rankText(b->prev(), " (ring predecessor) did not connect"),
                             timeout);
    }
    fds.clear();
    if (listener->listening()) listener->addPollFds(&fds);
    if (!have_next) fds.push_back({b->next_fd.get(), next.pollEvents(), 0});
    const int slice = listener->listening() ? listener->pollTimeoutMs(wait.sliceMs()) : wait.sliceMs();
    if (::poll(fds.data(), fds.size(), slice) < 0)
      for (pollfd& p : fds) p.revents = 0;  // EINTR: look again
    if (listener->listening()) listener->handlePollFds(fds.data());
  }
}

// Dials the root (it may not listen yet when EP_COMM_ID names another host);
// a root of this process that failed is not waited for.
epResult_t dialRoot(const Bootstrap* b, const SocketAddress& root_addr, const Wait& wait, Fd* root_fd) {
  const RootSlot* local_root = findRootSlot(b->nonce);
  const std::atomic<int>* root_failed = local_root != nullptr ? &local_root->failed : nullptr;
  const std::string root_text = root_addr.toString();
  Wait connect_wait = wait;
  connect_wait.abort_flags[2] = root_failed;
  const IoResult r = connectWithRetry(root_addr, connect_wait, root_fd);
  if (r.status == IoStatus::kAborted && root_failed != nullptr && root_failed->load() != 0 &&
      local_root->nonce.load() == b->nonce)
    return setError(b->comm, epRemoteError,
                    "bootstrap: rank %d: the root at %s, in this process, failed before this rank reached it "
                    "(see its warning)",
                    b->rank, root_text.c_str());
  // A root serves one communicator and then exits: a late rank, or a second
  // init with the same id, finds nobody there.
  if (r.status == IoStatus::kTimeout)
    return setError(b->comm, epTimeout,
                    "bootstrap: rank %d could not reach the root at %s within %d ms (%s; the id may be "
                    "spent: its communicator was already created, or the root's process is gone or has not "
                    "started)",
                    b->rank, root_text.c_str(), b->timeout_ms, r.describe().c_str());
  if (r.status == IoStatus::kAborted)
    return setError(b->comm, epAborted, "bootstrap: rank %d: aborted while connecting to the root at %s", b->rank,
                    root_text.c_str());
  if (!r.ok())
    return setError(b->comm, epSystemError, "bootstrap: rank %d: connecting to the root at %s failed: %s", b->rank,
                    root_text.c_str(), r.describe().c_str());
  return epSuccess;
}

// Says hello to the root on root_fd and waits for its reply (*h), until it
// has heard from everybody. Dials again while the root drops the connection
// before the hello is through (a flood of strangers there, or this rank too
// slow to answer its challenge).
epResult_t helloToRoot(const Bootstrap* b, const SocketAddress& root_addr, const SocketAddress& listen_addr,
                       const Wait& wait, Fd* root_fd, hs::ClientHandshake* h) {
  const std::string root_text = root_addr.toString();
  const int rank = b->rank, timeout = b->timeout_ms;
  for (;;) {
    RootHelloBody body;
    memset(&body, 0, sizeof(body));
    body.rank = rank;
    body.nranks = b->nranks;
    body.timeout_ms = timeout;
    body.remaining_ms = int32_t(std::min<int64_t>(wait.remainingMs(), INT32_MAX));
    packAddress(listen_addr, &body.listen);
    h->start(root_fd->get(), b->key, b->nonce, hs::kPurposeRoot, &body, sizeof(body));
    const IoResult r = hs::runClientHandshake(h, root_fd->get(), wait.extendedBy(kRootReplyGraceMs));
    if (r.status == IoStatus::kTimeout)
      return setError(b->comm, epTimeout,
                      "bootstrap: rank %d: the root at %s did not answer within %d ms (the id may be spent: "
                      "its communicator was already created, or the root's process is gone)",
                      rank, root_text.c_str(), timeout);
    if (!r.ok()) return ioFailure(b->comm, r, rank, "waiting for the root at " + root_text, timeout);
    using Failure = hs::ClientHandshake::Failure;
    if (h->state() == hs::ClientHandshake::State::kDone) return epSuccess;
    if (h->failure == Failure::kDropped && !wait.expired()) {
      root_fd->reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(kRedialMs));
      EPCHECK(dialRoot(b, root_addr, wait, root_fd));
      continue;
    }
    switch (h->failure) {
      // A connection still in the root's backlog when it gives up is reset:
      // the root never had a descriptor for it, so it could not say why.
      case Failure::kClosedBeforeChallenge:
        return setError(b->comm, epRemoteError,
                        "bootstrap: rank %d: the root at %s closed the connection without an answer (it gave "
                        "up, or could not take this rank's connection, e.g. out of file descriptors: see the "
                        "warnings of the root's process)",
                        rank, root_text.c_str());
      case Failure::kForeign:
        return setError(b->comm, epRemoteError,
                        "bootstrap: rank %d: %s answered with something that is not a moeep bootstrap reply "
                        "(another program on that port?): %s",
                        rank, root_text.c_str(), h->why.c_str());
      case Failure::kBadReply:
        return setError(b->comm, epRemoteError,
                        "bootstrap: rank %d: the root at %s failed authentication: %s (is it this job's root? the "
                        "same id, or EP_COMM_SECRET, on every rank?)",
                        rank, root_text.c_str(), h->why.c_str());
      case Failure::kIo: return ioFailure(b->comm, h->io, rank, "talking to the root at " + root_text, timeout);
      case Failure::kDropped:
      case Failure::kNone: break;
    }
    return setError(b->comm, epTimeout,
                    "bootstrap: rank %d: the root at %s dropped this rank's connection and its timeout (%d ms) "
                    "passed before another hello went through",
                    rank, root_text.c_str(), timeout);
  }
}

}  // namespace

void (*g_ring_listening_hook)(int rank, const SocketAddress& addr) = nullptr;

bool bootstrapIdInfo(const epUniqueId& id, BootstrapKey* key, uint64_t* job, SocketAddress* root) {
  if (!bootstrapIdValid(id)) return false;
  IdLayout layout;
  memcpy(&layout, id.internal, sizeof(layout));
  if (key != nullptr) *key = keyOf(layout);
  if (job != nullptr) *job = layout.nonce;
  if (root != nullptr) unpackAddress(layout.root, root);
  secureZero(&layout, sizeof(layout));
  return true;
}

ListenerOptions bootstrapListenerOptions(const Bootstrap* b, uint16_t purpose, const std::string& name) {
  ListenerOptions options;
  options.name = name;
  options.key = b->key;
  options.job = b->nonce;
  options.purpose = purpose;
  options.hello_ms = helloTimeoutMs();
  options.other_job_text = "it belongs to another job (a rank of an earlier run?)";
  return options;
}

epResult_t bootstrapInit(const epUniqueId& id, int rank, int nranks, int timeout_ms,
                         const std::atomic<int>* abort_flag, epComm* comm, Bootstrap** out,
                         const std::atomic<int>* init_abort) {
  if (out == nullptr) return setError(comm, epInvalidArgument, "bootstrap: output pointer is NULL");
  *out = nullptr;
  if (nranks < 1) return setError(comm, epInvalidArgument, "bootstrap: nranks %d is not positive", nranks);
  if (rank < 0 || rank >= nranks)
    return setError(comm, epInvalidArgument, "bootstrap: rank %d is out of range [0, %d)", rank, nranks);
  if (memcmp(id.internal, kOldIdMagic, sizeof(kOldIdMagic)) == 0)
    return setError(comm, epInvalidArgument,
                    "bootstrap: the unique id was made by an earlier libmoeep (every rank must run the same build)");
  if (!bootstrapIdValid(id))
    return setError(comm, epInvalidArgument,
                    "bootstrap: the unique id is not one made by epGetUniqueId (bad magic or address)");
  std::unique_ptr<Bootstrap> b(new (std::nothrow) Bootstrap);
  if (b == nullptr) return setError(comm, epOutOfMemory, "bootstrap: cannot allocate the bootstrap state");
  b->rank = rank;
  b->nranks = nranks;
  b->timeout_ms = effectiveTimeoutMs(timeout_ms);
  b->user_abort = abort_flag;
  b->comm = comm;
  SocketAddress root_addr;
  bootstrapIdInfo(id, &b->key, &b->nonce, &root_addr);
  IdLayout layout;
  memcpy(&layout, id.internal, sizeof(layout));
  const bool root_by_rank0 = layout.root_by_rank0 != 0;
  secureZero(&layout, sizeof(layout));

  const int timeout = b->timeout_ms;
  const Wait wait = Wait::afterMs(timeout, abort_flag, init_abort);
  const std::string root_text = root_addr.toString();
  if (root_by_rank0 && rank == 0) EPCHECK(startRoot(root_addr, b->nonce, b->key, nullptr));
  if (!b->key.authenticated)
    EP_INFO(kSubsysBootstrap,
            "bootstrap: rank %d: EP_COMM_ID without EP_COMM_SECRET: this bootstrap is UNAUTHENTICATED (anyone who "
            "reaches %s or a rank's port can join or disturb the job; docs/SEMANTICS.md)",
            rank, root_text.c_str());

  // 1. Reach the root.
  Fd root_fd;
  EPCHECK(dialRoot(b.get(), root_addr, wait, &root_fd));

  // 2. Our own listener exists before the root learns its address, so the
  //    predecessor's connect can never race ahead of it. One rank needs no ring.
  ListenerOptions options =
      bootstrapListenerOptions(b.get(), hs::kPurposeRing, "bootstrap: rank " + std::to_string(rank) + "'s ring listener");
  options.max_payload = sizeof(RingHelloBody);
  GuardedListener listener(std::move(options));
  SocketAddress listen_addr;
  if (nranks > 1) {
    std::string error;
    SocketAddress bind_addr;
    if (!chooseRankListenAddress(root_fd.get(), root_addr.family(), &bind_addr, &error) ||
        !listener.listen(bind_addr, &listen_addr, &error))
      return setError(comm, epSystemError, "bootstrap: rank %d: %s", rank, error.c_str());
    if (g_ring_listening_hook != nullptr) g_ring_listening_hook(rank, listen_addr);
  }

  // 3. Hello to the root, then wait until it has heard from everybody.
  hs::ClientHandshake h;
  EPCHECK(helloToRoot(b.get(), root_addr, listen_addr, wait, &root_fd, &h));
  root_fd.reset();
  if (h.status != epSuccess) {
    const std::string text = textOf(h.reply_payload);
    if (!h.authentic)
      return setError(comm, resultOf(h.status),
                      "bootstrap: rank %d of %d: the root at %s refused this rank (its reply is not authenticated: "
                      "it does not hold this rank's key): %s",
                      rank, nranks, root_text.c_str(), text.c_str());
    return setError(comm, resultOf(h.status), "bootstrap: rank %d of %d: %s", rank, nranks, text.c_str());
  }

  // 4. The ring.
  if (nranks > 1) {
    SocketAddress next_addr;
    PackedAddress packed;
    const bool have_addr = h.reply_payload.size() == sizeof(packed);
    if (have_addr) memcpy(&packed, h.reply_payload.data(), sizeof(packed));
    if (!have_addr || !unpackAddress(packed, &next_addr))
      return setError(comm, epInternalError, "bootstrap: rank %d: the root sent no address for rank %d", rank,
                      (rank + 1) % nranks);
    EPCHECK(joinRing(b.get(), &listener, next_addr, wait));
  }
  EP_INFO(kSubsysBootstrap, "bootstrap: rank %d of %d joined (root %s, listen %s, %s)", rank, nranks,
          root_text.c_str(), nranks > 1 ? listen_addr.toString().c_str() : "-",
          b->key.authenticated ? "authenticated" : "UNAUTHENTICATED");
  *out = b.release();
  return epSuccess;
}

}  // namespace ep
