// The host backend's connections across nodes: one network transport (a
// version-2 table: ibverbs, socket) joining this rank to each peer on another
// node, over which the rings of ring.h run as puts with a signal.
//
// Setup is collective (every rank calls open with the same peer sets, which
// the node map decides): the ranks agree on the transport, each makes an
// endpoint per remote peer, the endpoints cross the bootstrap, each rank
// connects to its remote peers in ascending rank order, then registers its
// segment and the segments' handles cross the bootstrap too.
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
  // transport: an available version-2 entry. cls: the traffic class of
  // every connection these links make.
  NetLinks(const TransportEntry* transport, const BackendComm& comm, epTrafficClass_t cls);
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

  // Collective. remote[r]: rank r is reached through these links. segment:
  // this rank's memory (the caller's, kept for the links' life) that peers
  // put into.
  epResult_t open(const std::vector<bool>& remote, void* segment, size_t bytes);

  bool remote(int r) const { return r >= 0 && r < int(remote_.size()) && remote_[size_t(r)]; }
  const char* transportName() const { return transport_->name; }

  // Puts bytes at local_offset of this rank's segment to peer's segment at
  // remote_offset, then (signal) value into the word at signal_offset there.
  // epInProgress: the connection's queue is full; progress, then try again.
  epResult_t put(int peer, size_t local_offset, size_t remote_offset, size_t bytes, size_t signal_offset,
                 uint64_t value);
  // A signal alone (credits, closing flags).
  epResult_t signal(int peer, size_t signal_offset, uint64_t value) {
    return put(peer, 0, 0, 0, signal_offset, value);
  }
  // Lets the transport move data. On a transport error, says which peer
  // (-1: none in particular) and why.
  epResult_t progress(int* peer, std::string* why);
  // Connection details of peer for epCommPeerInfo (false: not a network peer).
  bool connInfo(int peer, epTransportConnInfo_v2_t* info) const;

 private:
  epResult_t fail(epResult_t res, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  epResult_t exchangeEndpoints(std::vector<std::vector<uint8_t>>* theirs);
  epResult_t exchangeHandles();

  const TransportEntry* transport_;
  const epTransport_v2_t* t_;
  BackendComm comm_;
  epTrafficClass_t cls_;
  void* tcomm_ = nullptr;                        // comm_open's context
  void* mem_ = nullptr;                          // reg_mem of the segment
  std::vector<bool> remote_;                     // [R]
  std::vector<void*> conns_;                     // [R], null where not remote
  std::vector<std::vector<uint8_t>> handles_;    // [R] each rank's segment handle
};

}  // namespace host
}  // namespace ep
