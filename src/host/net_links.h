// The host backend's connections across nodes: one network transport (a
// version-2 table: ibverbs, socket) joining this rank to its peers on other
// nodes, over which the rings of ring.h run as puts with a signal.
//
// Each traffic class has connections of its own, so that the fabric can keep
// them apart (service level, traffic class / DSCP):
//   throughput   to the rank's throughput peers (its rail pairs: a token
//                crosses the network once per node, to its rail peer)
//   low latency  to every rank on another node, made at the first
//                low-latency call (a rank that never makes one opens none),
//                or at open where config.enable_shrink is set (a death
//                breaks the bootstrap that the first call connects over)
//   control      to every rank on another node: credits, call numbers, and
//                the counts of ranks with no throughput connection between
//                them (closing flags go on the connection of the ring's last
//                chunk, so that they land after it)
// Setup is collective per class (every rank calls open, and connectClass,
// with the same peer sets, which the node map decides): each rank makes an
// endpoint per (peer, class), the endpoints cross the bootstrap, each rank
// connects in ascending rank order. The segment is registered once, its
// handles crossing the bootstrap at open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../backend_comm.h"
#include "../transport.h"

namespace ep {
namespace host {

class NetLinks {
 public:
  // transport: an available version-2 entry.
  NetLinks(const TransportEntry* transport, const BackendComm& comm);
  // Closes the connections, deregisters the segment, closes the transport's
  // communicator context.
  ~NetLinks();
  NetLinks(const NetLinks&) = delete;
  NetLinks& operator=(const NetLinks&) = delete;

  // Collective: the network transport every rank will use for the ranks on
  // other nodes, or null (*out) where there is one node or no rank has one.
  // EP_TRANSPORTS narrows the choice; ibverbs is preferred to socket. Ranks
  // that would choose differently fail here, naming one another, instead of
  // hanging in a later collective.
  static epResult_t choose(const BackendComm& comm, const TransportEntry** out);

  // Collective. remote[r]: rank r is reached through these links;
  // throughput[r]: high-throughput traffic goes to r (a subset of remote).
  // Connects the control and throughput classes (the QP budget is checked
  // for all three first). segment: this rank's memory (the caller's, kept
  // for the links' life) that peers put into.
  epResult_t open(const std::vector<bool>& remote, const std::vector<bool>& throughput, void* segment,
                  size_t bytes);
  // Collective: connects cls to every remote rank, unless done already
  // (the low-latency class, at the first low-latency call of every rank),
  // then a barrier, so that no rank puts before every side is ready. A
  // failure is passed around the bootstrap ring to the ranks waiting in it.
  epResult_t connectClass(epTrafficClass_t cls);
  bool classConnected(epTrafficClass_t cls) const { return class_connected_[cls]; }

  bool remote(int r) const { return r >= 0 && r < int(remote_.size()) && remote_[size_t(r)]; }
  bool connected(int peer, epTrafficClass_t cls) const {
    return remote(peer) && conns_[slot(peer, cls)] != nullptr;
  }
  const char* transportName() const { return transport_->name; }

  // Puts bytes at local_offset of this rank's segment to peer's segment at
  // remote_offset on peer's connection of class cls (connected), then
  // (signal) value into the word at signal_offset there.
  // epInProgress: the connection's queue is full; progress, then try again.
  epResult_t put(int peer, epTrafficClass_t cls, size_t local_offset, size_t remote_offset, size_t bytes,
                 size_t signal_offset, uint64_t value);
  // A signal alone (credits, call numbers, closing flags), on the control class unless said.
  epResult_t signal(int peer, size_t signal_offset, uint64_t value, epTrafficClass_t cls = epTrafficControl) {
    return put(peer, cls, 0, 0, 0, signal_offset, value);
  }
  // Lets the transport move data. On a transport error, says which peer
  // (-1: none in particular) and why.
  epResult_t progress(int* peer, std::string* why);
  // Whether the transport can block until something comes (a version-3
  // table with wait): a rank that waits only for network peers then sleeps
  // in wait instead of napping between looks.
  bool canWait() const { return transport_->wait != nullptr; }
  // Blocks until a peer's signal or a completion may have come, or
  // timeout_us passed, moving data as progress does (canWait(); otherwise it
  // naps). Errors as progress.
  epResult_t wait(int timeout_us, int* peer, std::string* why);
  // After a shrink: the transport gives peer (dead) up and forgets its
  // errors, then every connection to it is closed. epNotSupported where the
  // transport cannot (no drop_peer: canDrop()).
  epResult_t dropPeer(int peer);
  bool canDrop() const { return transport_->drop_peer != nullptr; }
  // Connection details of peer for epCommPeerInfo (false: not a network
  // peer): its throughput connection, else its control one.
  bool connInfo(int peer, epTransportConnInfo_v2_t* info) const;

 private:
  static size_t slot(int peer, epTrafficClass_t cls) { return size_t(peer) * EP_TRAFFIC_CLASSES + size_t(cls); }
  epResult_t fail(epResult_t res, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  // res; where it is an error, the peer it concerns and why (last_error).
  epResult_t whyFailed(epResult_t res, int* peer, std::string* why);
  // Collective: connects cls to the ranks of peers (each rank's set must
  // hold it where it holds that rank).
  epResult_t connectPeers(epTrafficClass_t cls, const std::vector<bool>& peers);
  epResult_t exchangeEndpoints(epTrafficClass_t cls, const std::vector<bool>& peers,
                               std::vector<std::vector<uint8_t>>* theirs);
  epResult_t exchangeHandles();

  const TransportEntry* transport_;
  const epTransport_v2_t* t_;
  BackendComm comm_;
  void* tcomm_ = nullptr;                        // comm_open's context
  void* mem_ = nullptr;                          // reg_mem of the segment
  std::vector<bool> remote_;                     // [R]
  std::vector<void*> conns_;                     // [R * classes], null where not connected
  bool class_connected_[EP_TRAFFIC_CLASSES] = {false, false, false};
  std::vector<std::vector<uint8_t>> handles_;    // [R] each rank's segment handle
};

}  // namespace host
}  // namespace ep
