// The agreement on the dead set of a shrink (docs/SHRINK.md, "Agreement"),
// as a state machine of one survivor: no sockets, no clocks. The caller
// carries the messages over its own connections and says when a peer stayed
// silent past the round's bound; tests drive many of them over a simulated
// network (tests/unit/test_agreement.cc). recovery_link.h drives it over
// real connections for epCommShrink.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace ep {
namespace recovery {

struct AgreeMessage {
  uint32_t epoch = 0;
  uint32_t round = 0;       // 1, 2, ...; 0 with decide
  std::vector<bool> dead;   // [R]
  uint64_t counter = 0;     // the largest call number seen
  bool changed = false;     // the sender's set grew in this round
  bool decide = false;      // the sender decided: dead and counter are final
};

class Agreement {
 public:
  enum class State {
    kRunning,
    kDecided,    // dead() and counter() are final, the same on every survivor that decides
    kMinority,   // this side holds no majority of the previous membership: no decision
    kExcluded,   // another survivor counts this rank as dead
    kSuperseded  // a message of a newer epoch came: this shrink is over, another began
  };

  // members: the previous membership ([R], this rank among them); suspects:
  // ranks this rank already knows to be gone; counter: its largest call number.
  Agreement(int rank, const std::vector<bool>& members, uint32_t epoch, const std::vector<int>& suspects,
            uint64_t counter);

  // What this rank sends now to every rank not in dead(): its message of the
  // current round, or once decided the decision (sent again to whoever asks).
  AgreeMessage outgoing() const;
  // The peers this rank waits for in the current round (members not dead and
  // not yet heard in it).
  std::vector<int> waitingFor() const;
  // A message from rank `from` (in order per sender).
  void receive(int from, const AgreeMessage& m);
  // `from` stayed silent past the round's bound, or its connection failed.
  void silent(int from);
  // Moves to the next round, or decides, once every awaited message of this
  // round is in. True when something changed (a new round, a decision).
  bool step();

  State state() const { return state_; }
  uint32_t round() const { return round_; }
  const std::vector<bool>& dead() const { return dead_; }
  uint64_t counter() const { return counter_; }

 private:
  bool majority() const;
  void suspect(int r);
  void adopt(const AgreeMessage& m);

  int rank_;
  int nranks_;
  std::vector<bool> members_;
  uint32_t epoch_;
  std::vector<bool> dead_;
  uint64_t counter_;
  uint32_t round_ = 1;
  bool grew_ = false;  // the set grew (or the counter rose) since this round began
  State state_ = State::kRunning;
  // Messages of this round and later ones, by round then sender.
  std::map<uint32_t, std::map<int, AgreeMessage>> inbox_;
};

}  // namespace recovery
}  // namespace ep
