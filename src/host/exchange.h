// The host backend's progress engine: one collective step in which every rank
// sends a stream of fixed-size records to every rank and receives one from
// every rank, through the rings of ring.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "../backend_comm.h"
#include "../routing.h"
#include "net_links.h"
#include "ring.h"

namespace ep {
namespace host {

struct StreamSpec {
  int records = 0;  // records to send to (or receive from) this peer in this step
  // Send side: write records [first, first + n) of the stream to out.
  std::function<void(int first, int n, uint8_t* out)> pack;
  // Receive side: consume records [first, first + n) from in.
  std::function<void(int first, int n, const uint8_t* in)> unpack;
};

class Exchanger {
 public:
  // segments[r] is rank r's segment as mapped in this process (own one
  // included; null for a rank on another node). net: the links to the ranks
  // on other nodes (null: every rank is mapped); staging[r]: rank r's
  // staging ring in this rank's segment (-1 where r is mapped).
  Exchanger(const BackendComm& comm, std::vector<void*> segments, const RingGeometry& geometry,
            NetLinks* net = nullptr, std::vector<int> staging = {});
  // Runs one step, the next collective call of this rank (each step is one;
  // the chunks carry its number, so that ranks out of step are found).
  // Receives are consumed in ascending source rank order (this rank's own
  // stream at its place), which is what makes combine deterministic. `what`
  // names the step in error messages ("dispatch counts").
  // order (optional): the sources in the order their streams are consumed,
  // every rank once (hierarchical combine: nodes ascending).
  epResult_t run(ChunkKind kind, std::vector<StreamSpec>& sends, std::vector<StreamSpec>& recvs, const char* what,
                 const std::vector<int>* order = nullptr);
  // The count exchange of a dispatch (a step of its own): tells every rank
  // how many tokens this one sends it (r's send side), and fills r's receive
  // side from what every rank says it sends here.
  epResult_t exchangeCounts(ChunkKind kind, Routing* r, const char* what);
  // Marks this rank's rings closed, in its own segment and in its peers'
  // (the communicator is going away): peers waiting on it stop waiting.
  void announceClose();
  // Collective steps this rank made (the number of the latest).
  uint64_t steps() const { return calls_; }
  // After a shrink (docs/SHRINK.md): the dead ranks get and give nothing from
  // now on, and the survivors go on from step `steps`, the largest any of
  // them reached. Chunks of earlier steps still in a ring, or landing later
  // (the failed call's), are taken and dropped, not read.
  void shrink(const std::vector<bool>& dead, uint64_t steps);

 private:
  epResult_t runCall(ChunkKind kind, uint64_t call_seq, std::vector<StreamSpec>& sends,
                     std::vector<StreamSpec>& recvs, const char* what, const std::vector<int>* order);
  epResult_t connectLowLatency(const char* what);
  bool peerClosed(int rank) const;
  bool remote(int rank) const { return net_ != nullptr && net_->remote(rank); }
  // The connection class of kind's chunks to rank d (on another node): low
  // latency for the low-latency calls, else throughput where the pair has a
  // throughput connection (rail pairs), else control (the counts of a
  // dispatch, which every pair exchanges).
  epTrafficClass_t classFor(ChunkKind kind, int d) const;
  // Sends to a rank on another node what fits in its ring; *moved when a
  // chunk went. Errors name the peer.
  epResult_t sendRemote(int d, ChunkKind kind, uint64_t call_seq, StreamSpec& spec, int* sent, bool* moved,
                        const char* what);
  // Returns consumed chunks' credits to ranks on other nodes (each ring's
  // tail, as a signal into the source's shadow); false while some are owed.
  bool returnCredits();
  // Progresses until every rank on another node took every chunk this rank
  // put into its ring (the credits say so): nothing of this rank's is left
  // for its progress to post. Errors name the peer waited for.
  epResult_t drainRemote(const char* what, uint64_t call_seq);
  epResult_t netFailed(epResult_t res, int peer, const std::string& why, const char* what, uint64_t call_seq);
  epResult_t failPeerGone(int gone, bool closed, const char* what, uint64_t call_seq);
  epResult_t failTimeout(const std::vector<StreamSpec>& sends, const std::vector<StreamSpec>& recvs,
                         const std::vector<int>& sent, int recv_cursor, const std::vector<int>& received,
                         const char* what, uint64_t call_seq);

  BackendComm comm_;
  uint64_t calls_ = 0;  // collective calls this rank made (the number of the latest)
  std::vector<void*> segments_;
  RingGeometry geo_;
  std::vector<uint8_t> scratch_;  // one chunk of records for this rank's stream to itself
  NetLinks* net_ = nullptr;
  std::vector<int> staging_;        // [R]
  std::vector<uint64_t> credited_;  // [R] the tail each remote source was last told
  std::vector<int> ring_cls_;       // [R] the class of the last chunk put into d's ring (-1: none yet)
  std::vector<bool> dead_;          // [R] ranks a shrink removed
  uint64_t stale_before_ = 0;       // chunks of steps before this one are a failed call's: dropped
  bool dead(int r) const { return !dead_.empty() && dead_[size_t(r)]; }
};

}  // namespace host
}  // namespace ep
