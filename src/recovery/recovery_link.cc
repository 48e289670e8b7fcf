#include "recovery/recovery_link.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "bootstrap.h"
#include "bootstrap_ring.h"
#include "handshake.h"

namespace ep {
namespace recovery {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMessageMagic = 0x65705368u;  // 'epSh'

// A message on the wire: this head, then the dead set, a bit per rank.
struct WireHead {
  uint32_t magic;
  uint32_t epoch;
  uint32_t round;
  int32_t from;
  uint64_t counter;
  uint8_t changed;
  uint8_t decide;
  uint8_t pad[2];
  uint32_t nranks;
};
static_assert(sizeof(WireHead) == 32, "wire format");

size_t wireBytes(int nranks) { return sizeof(WireHead) + (size_t(nranks) + 7) / 8; }

std::vector<uint8_t> encode(int from, const AgreeMessage& m) {
  const int R = int(m.dead.size());
  std::vector<uint8_t> out(wireBytes(R), 0);
  WireHead h;
  memset(&h, 0, sizeof(h));
  h.magic = kMessageMagic;
  h.epoch = m.epoch;
  h.round = m.round;
  h.from = from;
  h.counter = m.counter;
  h.changed = m.changed ? 1 : 0;
  h.decide = m.decide ? 1 : 0;
  h.nranks = uint32_t(R);
  memcpy(out.data(), &h, sizeof(h));
  for (int r = 0; r < R; r++)
    if (m.dead[size_t(r)]) out[sizeof(h) + size_t(r) / 8] |= uint8_t(1u << (r % 8));
  return out;
}

bool decode(const std::vector<uint8_t>& in, int nranks, int* from, AgreeMessage* m) {
  if (in.size() != wireBytes(nranks)) return false;
  WireHead h;
  memcpy(&h, in.data(), sizeof(h));
  if (h.magic != kMessageMagic || h.nranks != uint32_t(nranks) || h.from < 0 || h.from >= nranks) return false;
  *from = h.from;
  m->epoch = h.epoch;
  m->round = h.round;
  m->counter = h.counter;
  m->changed = h.changed != 0;
  m->decide = h.decide != 0;
  m->dead.assign(size_t(nranks), false);
  for (int r = 0; r < nranks; r++) m->dead[size_t(r)] = (in[sizeof(h) + size_t(r) / 8] >> (r % 8)) & 1u;
  return true;
}

int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

const char* stateName(Agreement::State s) {
  switch (s) {
    case Agreement::State::kRunning: return "running";
    case Agreement::State::kDecided: return "decided";
    case Agreement::State::kMinority: return "in a minority";
    case Agreement::State::kExcluded: return "excluded";
    case Agreement::State::kSuperseded: return "superseded";
  }
  return "?";
}

}  // namespace

RecoveryLink::RecoveryLink(const Bootstrap* b, ListenerOptions options)
    : rank_(b->rank), nranks_(b->nranks), key_(b->key), job_(b->nonce), listener_(std::move(options)) {}

epResult_t RecoveryLink::open(const Bootstrap* b, ShrinkNotice* heard, std::unique_ptr<RecoveryLink>* out,
                              std::string* why) {
  ListenerOptions options =
      bootstrapListenerOptions(b, hs::kPurposeRecovery, "rank " + std::to_string(b->rank) + "'s recovery listener");
  options.max_payload = wireBytes(b->nranks);
  std::unique_ptr<RecoveryLink> link(new RecoveryLink(b, std::move(options)));
  link->heard_ = heard;
  // Where this rank's bootstrap connections are: the address its peers reach.
  SocketAddress bind_addr;
  const int fd = b->next_fd.valid() ? b->next_fd.get() : b->prev_fd.get();
  if (fd >= 0 ? !localAddress(fd, &bind_addr) : !parseSocketAddress("127.0.0.1:0", AF_INET, &bind_addr, why)) {
    if (why->empty()) *why = "cannot read the address of the bootstrap connections";
    return epInternalError;
  }
  bind_addr.setPort(0);  // one rank alone (no ring): loopback, which nobody dials
  if (!link->listener_.listen(bind_addr, &link->address_, why)) return epSystemError;
  link->thread_ = std::thread(&RecoveryLink::serve, link.get());
  *out = std::move(link);
  return epSuccess;
}

RecoveryLink::~RecoveryLink() {
  stop_.store(1);
  if (thread_.joinable()) thread_.join();
  listener_.close();
}

void RecoveryLink::serve() {
  while (stop_.load() == 0) {
    VerifiedPeer peer;
    const IoResult r = listener_.acceptVerified(Wait::afterMs(200, &stop_), &peer);
    if (!r.ok()) continue;  // the slice ended, or stop
    Received got;
    if (!decode(peer.payload, nranks_, &got.from, &got.msg)) {
      listener_.refuse(&peer, epInvalidArgument, "not a shrink message of this communicator");
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(std::move(got));
      const Received& last = inbox_.back();
      uint32_t seen = newest_epoch_.load();
      while (last.msg.epoch > seen && !newest_epoch_.compare_exchange_weak(seen, last.msg.epoch)) {
      }
      if (heard_ != nullptr) heard_->record(last.msg.epoch, last.from, last.msg.dead);
    }
    cv_.notify_all();
    (void)listener_.reply(peer, epSuccess, nullptr, 0, Wait::afterMs(500, &stop_));
  }
}

bool RecoveryLink::send(int to, const AgreeMessage& m, int wait_ms, std::string* why, bool retry_refused,
                        bool* refused) {
  if (refused != nullptr) *refused = false;
  if (to < 0 || to >= int(peers_.size())) {
    *why = "no address";
    return false;
  }
  const Wait wait = Wait::afterMs(wait_ms, &stop_);
  Fd fd;
  IoResult r = connectWithRetry(peers_[size_t(to)], wait, &fd, retry_refused);
  if (!r.ok()) {
    *why = "connect: " + r.describe();
    // A refusal at once, or the last of a wait's refused attempts.
    if (refused != nullptr)
      *refused = (r.status == IoStatus::kError || r.status == IoStatus::kTimeout) && r.sys_errno == ECONNREFUSED;
    return false;
  }
  const std::vector<uint8_t> payload = encode(rank_, m);
  hs::ClientHandshake h;
  h.start(fd.get(), key_, job_, hs::kPurposeRecovery, payload.data(), payload.size());
  r = hs::runClientHandshake(&h, fd.get(), wait);
  if (!r.ok()) {
    *why = "hello: " + r.describe();
    return false;
  }
  if (h.state() != hs::ClientHandshake::State::kDone || !h.authentic || h.status != epSuccess) {
    *why = "refused" + (h.why.empty() ? std::string() : ": " + h.why);
    return false;
  }
  return true;
}

bool RecoveryLink::receive(Received* out, int wait_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(std::max(wait_ms, 0)), [this] { return !inbox_.empty(); }))
    return false;
  *out = std::move(inbox_.front());
  inbox_.pop_front();
  return true;
}

epResult_t runAgreement(RecoveryLink& link, const std::vector<bool>& members, uint32_t epoch,
                        const std::vector<int>& suspects, uint64_t counter, const AgreeOptions& o,
                        AgreeResult* out) {
  const int R = int(members.size()), me = link.rank();
  Agreement a(me, members, epoch, suspects, counter);
  const auto start = Clock::now();
  std::vector<Clock::time_point> heard(size_t(R), start);    // last message from each rank
  std::vector<Clock::time_point> failing(size_t(R), start);   // first failed delivery of a streak
  std::vector<bool> failing_now(size_t(R), false);
  // The last delivery found nobody listening: the rank's recovery listener,
  // open from init to destroy, is gone with its process (a full backlog
  // drops connections, it does not refuse them). Dead at once.
  std::vector<bool> refused_now(size_t(R), false);
  std::vector<bool> said_decided(size_t(R), false);           // the barrier: every survivor decided
  bool reset_done = false;                                    // o.on_decided ran
  AgreeMessage last_sent;
  bool sent_any = false;
  auto last_send = start;
  const int unreachable_ms = std::max(o.silence_ms / 10, 500);

  auto sendAll = [&](const AgreeMessage& m) {
    for (int r = 0; r < R; r++) {
      if (r == me || !members[size_t(r)] || m.dead[size_t(r)]) continue;
      std::string why;
      bool refused = false;
      const bool sent = link.send(r, m, o.send_wait_ms, &why, /*retry_refused=*/false, &refused);
      refused_now[size_t(r)] = refused;
      if (sent) {
        failing_now[size_t(r)] = false;
      } else if (!failing_now[size_t(r)]) {
        failing_now[size_t(r)] = true;
        failing[size_t(r)] = Clock::now();
      }
    }
    last_sent = m;
    sent_any = true;
    last_send = Clock::now();
  };

  for (;;) {
    if (o.abort && o.abort->load() != 0) {
      out->why = "aborted";
      return epAborted;
    }
    const AgreeMessage m = a.outgoing();
    const bool news = !sent_any || m.round != last_sent.round || m.decide != last_sent.decide ||
                      m.dead != last_sent.dead || m.counter != last_sent.counter;
    if (news || msSince(last_send) >= o.resend_ms) sendAll(m);

    RecoveryLink::Received got;
    // Waits for the first message only (when nothing new went out), then
    // takes what else is there: waiting again after each message would
    // hold every round's step back by a full wait after its last message.
    for (int wait_ms = news ? 0 : std::min(o.resend_ms, 50); link.receive(&got, wait_ms); wait_ms = 0) {
      heard[size_t(got.from)] = Clock::now();
      if (got.msg.epoch == epoch && got.msg.decide) said_decided[size_t(got.from)] = true;
      a.receive(got.from, got.msg);
    }
    if (a.state() == Agreement::State::kRunning) {
      for (int r : a.waitingFor()) {
        const bool unreachable =
            failing_now[size_t(r)] && (refused_now[size_t(r)] || msSince(failing[size_t(r)]) > unreachable_ms);
        if (unreachable || msSince(heard[size_t(r)]) > o.silence_ms) a.silent(r);
      }
      a.step();
    }
    switch (a.state()) {
      case Agreement::State::kRunning: continue;
      case Agreement::State::kDecided: break;
      default:
        out->state = a.state();
        out->dead = a.dead();
        out->counter = a.counter();
        out->why = std::string("this rank is ") + stateName(a.state());
        return epSuccess;
    }
    if (!reset_done) {
      reset_done = true;
      std::string why;
      const epResult_t rc = o.on_decided ? o.on_decided(a.dead(), &why) : epSuccess;
      if (rc != epSuccess) {
        out->state = Agreement::State::kDecided;
        out->dead = a.dead();
        out->counter = a.counter();
        out->why = "this rank decided but could not reset its state: " + why;
        return rc;
      }
      continue;  // the decision goes out at the top of the loop
    }
    // Decided: the barrier. Every survivor must say it decided (the DECIDE
    // relay brings the late ones there); one that dies meanwhile ends this
    // shrink with an error, and another may follow.
    int missing = -1;
    for (int r = 0; r < R && missing < 0; r++)
      if (r != me && members[size_t(r)] && !a.dead()[size_t(r)] && !said_decided[size_t(r)]) missing = r;
    if (missing < 0) {
      sendAll(a.outgoing());  // the last ones to decide hear it from everyone
      // The excluded notice: a rank counted dead that is alive (it was slow)
      // adopts the decision and finds itself in it. Best effort, brief: the
      // dead refuse at once.
      const AgreeMessage decision = a.outgoing();
      for (int r = 0; r < R; r++) {
        if (r == me || !members[size_t(r)] || !decision.dead[size_t(r)]) continue;
        std::string why;
        (void)link.send(r, decision, std::min(o.send_wait_ms, 200), &why, /*retry_refused=*/false);
      }
      out->state = Agreement::State::kDecided;
      out->dead = a.dead();
      out->counter = a.counter();
      return epSuccess;
    }
    const bool unreachable = failing_now[size_t(missing)] &&
                             (refused_now[size_t(missing)] || msSince(failing[size_t(missing)]) > unreachable_ms);
    if (unreachable || msSince(heard[size_t(missing)]) > o.silence_ms) {
      out->state = Agreement::State::kDecided;
      out->dead = a.dead();
      out->counter = a.counter();
      out->why = "rank " + std::to_string(missing) + " did not confirm the decision (it died during the shrink?)";
      return epRemoteError;
    }
  }
}

}  // namespace recovery
}  // namespace ep
