// The connections of a shrink's agreement (docs/SHRINK.md, "Agreement"): a
// death breaks the bootstrap ring, so the survivors talk over links of their
// own. Each rank has a guarded listener of purpose kPurposeRecovery (only the
// job's ranks get in), served by a thread of its own so that messages arrive
// wherever the rank is (in a call, in the agreement, sending). A message is
// one authenticated hello: its payload is the whole message, which the thread
// puts in the inbox before it replies. A send dials the peer's listener and
// says hello; a peer that is gone refuses, resets or never answers.
//
// runAgreement drives an Agreement (agreement.h) over these links: rounds,
// silence, the DECIDE relay, then a barrier in which every survivor has
// decided. epCommShrink (src/api_shrink.cc) runs it; tested across
// processes by tests/unit/test_recovery_link.cc.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap_auth.h"
#include "guarded_listener.h"
#include "moeep.h"
#include "recovery/agreement.h"
#include "recovery/shrink_notice.h"
#include "socket.h"

namespace ep {

struct Bootstrap;

namespace recovery {

class RecoveryLink {
 public:
  // Listens on the address of the rank's bootstrap connections (port chosen
  // by the system), with the job's key, and starts the thread. heard (may be
  // NULL) records the first message of each newer epoch, for whoever watches
  // it without the link.
  static epResult_t open(const Bootstrap* b, ShrinkNotice* heard, std::unique_ptr<RecoveryLink>* out,
                         std::string* why);
  ~RecoveryLink();
  RecoveryLink(const RecoveryLink&) = delete;
  RecoveryLink& operator=(const RecoveryLink&) = delete;

  const SocketAddress& address() const { return address_; }
  // Every rank's listener (this one's included), from the init's allgather.
  void setPeers(std::vector<SocketAddress> peers) { peers_ = std::move(peers); }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  struct Received {
    int from = -1;
    AgreeMessage msg;
  };
  // Delivers m to rank `to` within wait_ms: false (with why) when the peer
  // refused, reset or did not answer. A refused connection is tried again
  // within wait_ms unless retry_refused is false: every rank's recovery port
  // listens from init to destroy, so a refusal means its process is gone,
  // and waiting out wait_ms would only delay the caller (other connect
  // errors are retried either way). *refused (when given): the last attempt
  // was refused.
  bool send(int to, const AgreeMessage& m, int wait_ms, std::string* why, bool retry_refused = true,
            bool* refused = nullptr);
  // The next message, waiting at most wait_ms; false when none came.
  bool receive(Received* out, int wait_ms);
  // The newest epoch any received message carried (0: none): a peer that
  // began a shrink announces it with its first message.
  uint32_t newestEpoch() const { return newest_epoch_.load(); }

 private:
  RecoveryLink(const Bootstrap* b, ListenerOptions options);
  void serve();

  int rank_ = 0, nranks_ = 0;
  BootstrapKey key_;
  uint64_t job_ = 0;
  GuardedListener listener_;
  SocketAddress address_;
  std::vector<SocketAddress> peers_;
  std::thread thread_;
  std::atomic<int> stop_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Received> inbox_;
  std::atomic<uint32_t> newest_epoch_{0};
  ShrinkNotice* heard_ = nullptr;
};

struct AgreeOptions {
  int silence_ms = 10000;  // a member not heard from this long (or unreachable for a tenth of it) is dead
  int resend_ms = 200;     // each message goes again this often, until answered by the next round
  int send_wait_ms = 500;  // one delivery's bound
  const std::atomic<int>* abort = nullptr;
  // Called once, when this rank decided and before its first message saying
  // so (the others wait in the final barrier for that message): what must
  // be done before any survivor goes on (Backend::resetForShrink). Its
  // failure ends the agreement with its error (the others then find this
  // rank silent in their barrier).
  std::function<epResult_t(const std::vector<bool>& dead, std::string* why)> on_decided;
};

struct AgreeResult {
  Agreement::State state = Agreement::State::kRunning;
  std::vector<bool> dead;  // [R], decided (kDecided)
  uint64_t counter = 0;
  std::string why;         // the state in words, for errors
};

// The agreement of epoch `epoch` among `members` ([R], this rank one of
// them): returns once this rank decided and every survivor said it decided
// too (kDecided), or it found itself excluded, in a minority, superseded by a
// newer epoch. epRemoteError (with out->why) when a survivor died during the
// final barrier; epAborted on abort.
epResult_t runAgreement(RecoveryLink& link, const std::vector<bool>& members, uint32_t epoch,
                        const std::vector<int>& suspects, uint64_t counter, const AgreeOptions& options,
                        AgreeResult* out);

}  // namespace recovery
}  // namespace ep
