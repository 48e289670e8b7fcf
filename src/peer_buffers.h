// The memory a rank offers its peers through one transport, and the peers'
// memory as reached from here. One owner for the setup every user of a
// transport goes through (register, exchange the handles, connect, wait for
// every rank, tell the transport) and for its teardown: the host backend's
// rings, the CUDA backend's two buffers and the call logs all use it.
//
// What a rank sends its peers (its offer: the handle of its registered
// memory) is kept apart from what it holds for each peer (the connection made
// from that peer's offer, and the peer's memory as reached through it), as a
// network transport needs: there a handle names remote memory, and a
// connection is a queue pair of its own. docs/ARCHITECTURE.md says how this
// maps onto transport ABI v1, whose reg_mem allocates the memory it registers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moeep_transport.h"

namespace ep {

struct Bootstrap;
struct TransportEntry;

// The memory a rank offers.
struct LocalMemory {
  size_t bytes = 0;
  int kind = EP_TRANSPORT_MEM_HOST;  // EP_TRANSPORT_MEM_HOST or EP_TRANSPORT_MEM_DEVICE
  // Memory of the caller's, kept alive by it for the PeerBuffers' life: what
  // a transport that registers its caller's memory takes. Transport ABI v1
  // cannot (its reg_mem allocates), so with v1 this stays null and the
  // transport's allocation, zero-filled, is registered (localPtr()).
  void* ptr = nullptr;
};

class PeerBuffers {
 public:
  // transport null: this rank offers nothing, and still takes part in the
  // exchange (which is collective).
  PeerBuffers(const TransportEntry* transport, int rank, int nranks);
  // Closes every connection, then deregisters this rank's memory.
  ~PeerBuffers();
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  // 1. Registers this rank's memory with the transport (this rank alone).
  epResult_t registerLocal(const LocalMemory& memory);
  bool registered() const { return local_.mem != nullptr; }
  void* localPtr() const { return local_.ptr; }

  // 2. Collective: every rank's offer to every rank, over the bootstrap.
  epResult_t exchange(Bootstrap* bootstrap);
  // Rank r registered memory and sent its handle (after exchange).
  bool offered(int r) const { return offers_[size_t(r)].registered != 0; }

  // *ok = 1 when the transport can join self and peer.
  epResult_t canConnect(const epPeerInfo_v1_t& self, const epPeerInfo_v1_t& peer, int* ok) const;
  // 3. Connects to rank r (another rank, which offered) from its handle;
  // peer is what r told at init, by which the transport picks the way.
  epResult_t connect(int r, const epPeerInfo_v1_t& peer);
  // Rank r's memory as reached from here (this rank's own for r = rank);
  // null where nothing was connected.
  void* peerPtr(int r) const { return r == rank_ ? local_.ptr : peers_[size_t(r)].ptr; }

  // 4. Collective: once every rank connected to every peer it wanted (a
  // barrier), lets the transport drop what it published for the connections
  // (shm: the name of the segment).
  epResult_t finish(Bootstrap* bootstrap);

 private:
  // What a rank sends every rank: whether it registered memory, and the
  // handle that names it.
  struct Offer {
    uint8_t registered;
    char handle[EP_TRANSPORT_HANDLE_BYTES];
  };
  // This rank's memory and the transport's registration of it.
  struct Local {
    void* mem = nullptr;  // the registration (dereg_mem)
    void* ptr = nullptr;  // where the memory lies
  };
  // What this rank holds for one peer.
  struct Peer {
    void* conn = nullptr;  // the connection (close)
    void* ptr = nullptr;   // the peer's memory as reached through it
  };

  const TransportEntry* transport_;
  int rank_;
  Local local_;
  std::vector<Offer> offers_;  // [R], every rank's, this rank's own included
  std::vector<Peer> peers_;    // [R], nothing for this rank
};

}  // namespace ep
