#include "peer_buffers.h"

#include "bootstrap.h"
#include "checks.h"
#include "transport.h"

namespace ep {

PeerBuffers::PeerBuffers(const TransportEntry* transport, int rank, int nranks)
    : transport_(transport), rank_(rank), offers_(size_t(nranks)), peers_(size_t(nranks)) {}

// Connections first: a transport may need the registration while a
// connection made against it is open.
PeerBuffers::~PeerBuffers() {
  if (transport_ == nullptr) return;
  for (Peer& p : peers_)
    if (p.conn) transport_->table->close(transport_->ctx, p.conn);
  if (local_.mem) transport_->table->dereg_mem(transport_->ctx, local_.mem);
}

epResult_t PeerBuffers::registerLocal(const LocalMemory& memory) {
  if (transport_ == nullptr || registered()) return epInternalError;
  // Mapped memory comes from version-1 tables; a network transport's
  // connections are NetLinks' (src/host/net_links.h).
  if (transport_->table == nullptr) return epNotSupported;
  // Transport ABI v1 registers only memory its reg_mem allocates itself.
  if (memory.ptr != nullptr) return epNotSupported;
  Offer& mine = offers_[size_t(rank_)];
  EPCHECK(transport_->table->reg_mem(transport_->ctx, memory.bytes, memory.kind, &local_.ptr, mine.handle,
                                     &local_.mem));
  mine.registered = 1;
  return epSuccess;
}

epResult_t PeerBuffers::exchange(Bootstrap* bootstrap) {
  return bootstrapAllGather(bootstrap, offers_.data(), sizeof(Offer));
}

epResult_t PeerBuffers::canConnect(const epPeerInfo_v1_t& self, const epPeerInfo_v1_t& peer, int* ok) const {
  *ok = 0;
  if (transport_ == nullptr) return epSuccess;
  return transport_->table->can_connect(transport_->ctx, &self, &peer, ok);
}

epResult_t PeerBuffers::connect(int r, const epPeerInfo_v1_t& peer) {
  if (transport_ == nullptr || r == rank_ || !offered(r) || peers_[size_t(r)].conn != nullptr) return epInternalError;
  Peer& p = peers_[size_t(r)];
  const epResult_t res = transport_->table->connect(transport_->ctx, &peer, offers_[size_t(r)].handle, &p.ptr, &p.conn);
  if (res != epSuccess) p.ptr = nullptr;  // a connection it made all the same is still closed (the destructor)
  return res;
}

epResult_t PeerBuffers::finish(Bootstrap* bootstrap) {
  EPCHECK(bootstrapBarrier(bootstrap));
  if (registered()) transport_->table->connected(transport_->ctx, local_.mem);
  return epSuccess;
}

}  // namespace ep
