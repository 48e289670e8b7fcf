// Per-pair message rings of the host backend.
//
// Every rank owns one shared segment, mapped by all its peers. For each source
// rank s it holds a ring of `slots` chunks that only s writes and only the
// owner reads:
//
//   RingCtrl { head: chunks s has published (written by s),
//              tail: chunks the owner has consumed (written by the owner) }
//   slot[i]  { ChunkHeader, records... }
//
// s writes chunk n into slot n % slots once n - tail < slots, then publishes
// head = n + 1 with release order; the owner reads the slot after an acquire
// load of head and releases it with tail = n + 1. Counters only grow, so no
// reset is ever needed between calls, and each (source, owner) pair is a FIFO:
// since every rank issues the same collectives in the same order, the chunks
// of one call never mix with another's. Each chunk says which call it
// belongs to, so ranks that fall out of step get an error, not wrong data.
// A rank that destroys its communicator marks its rings closed on both ends,
// so a peer still waiting on it fails at once instead of at its timeout. At
// each call a source also writes the call's number beside its head, so that a
// rank that times out waiting for it can say whether it made the call.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ep {
namespace host {

struct alignas(64) RingCtrl {
  uint64_t head;
  uint64_t source_closed;  // 1: the source destroyed (or aborted) its communicator
  uint64_t source_call;    // the latest collective call the source entered (its call_seq), for a timeout's report
  char pad0[40];
  uint64_t tail;
  uint64_t owner_closed;   // 1: the owner destroyed (or aborted) its communicator
  char pad1[48];
};
static_assert(sizeof(RingCtrl) == 128, "RingCtrl layout");

// The low-latency calls have kinds of their own, so that a rank in a
// low-latency call and a peer in a high-throughput one (same call sequence
// number) are told apart at the first chunk instead of reading each other's
// records.
enum ChunkKind : uint32_t {
  kChunkCounts = 1,
  kChunkDispatch = 2,
  kChunkCombine = 3,
  kChunkLLCounts = 4,
  kChunkLLDispatch = 5,
  kChunkLLCombine = 6,
  // Across nodes (hier.h): forwarded-token counts, tokens to a rail peer,
  // and nodes' partial sums back to their sources.
  kChunkForwardCounts = 7,
  kChunkForward = 8,
  kChunkPartials = 9,
  // Before a communicator's first low-latency call connects that class
  // (collective): every rank says it is there, so that a peer in another
  // call is told apart (epInvalidUsage) rather than met at the connect's
  // collective (a timeout).
  kChunkLLConnect = 10,
};

struct alignas(64) ChunkHeader {
  uint64_t call_seq;  // which collective call of the source this chunk belongs to
  uint32_t kind;      // ChunkKind
  uint32_t first;     // index of the first record within this call's stream
  uint32_t count;     // records in this chunk
  uint32_t pad[11];
};
static_assert(sizeof(ChunkHeader) == 64, "ChunkHeader layout");

// Where everything lies inside one rank's segment:
//   [nranks rings, one per source]
//   [nranks shadows]        only with peers on other nodes (staged > 0)
//   [staged staging rings]  one per peer on another node
// A peer on another node cannot be written directly: this rank packs a chunk
// into its own staging slot and the network transport puts it into the
// peer's ring, with the new head as the put's signal. The shadow of
// destination d keeps the counters of the ring this rank writes in d's
// segment: head (this rank's own count), and tail and owner_closed, which d
// puts here (its credits, and its closing).
struct RingGeometry {
  int nranks = 0;
  int slots = 0;
  size_t record_bytes = 0;  // largest record of any kind
  int chunk_records = 0;    // records per chunk
  int staged = 0;           // peers on other nodes (each has a staging ring here)
  // Whole cache lines, so that every slot's header (and, since RingCtrl is two
  // lines, every ring's control block) lies on a 64-byte boundary, as their
  // alignas(64) types require: records are only multiples of 16 bytes.
  size_t slotBytes() const {
    return (sizeof(ChunkHeader) + size_t(chunk_records) * record_bytes + 63) / 64 * 64;
  }
  size_t ringBytes() const { return sizeof(RingCtrl) + size_t(slots) * slotBytes(); }
  size_t ringsBytes() const { return size_t(nranks) * ringBytes(); }
  size_t shadowsBytes() const { return staged > 0 ? size_t(nranks) * sizeof(RingCtrl) : 0; }
  size_t segmentBytes() const {
    return ringsBytes() + shadowsBytes() + size_t(staged) * size_t(slots) * slotBytes();
  }
  // Offsets inside a segment, the same in every rank's (what puts address).
  size_t ctrlOffset(int src) const { return size_t(src) * ringBytes(); }
  size_t slotOffset(int src, uint64_t n) const {
    return ctrlOffset(src) + sizeof(RingCtrl) + size_t(n % uint64_t(slots)) * slotBytes();
  }
  size_t shadowOffset(int dst) const { return ringsBytes() + size_t(dst) * sizeof(RingCtrl); }
  size_t stagingOffset(int index, uint64_t n) const {
    return ringsBytes() + shadowsBytes() + (size_t(index) * size_t(slots) + size_t(n % uint64_t(slots))) * slotBytes();
  }
  // The ring that source rank `src` writes, inside the segment at base.
  RingCtrl* ctrl(void* base, int src) const {
    return reinterpret_cast<RingCtrl*>(static_cast<char*>(base) + ctrlOffset(src));
  }
  ChunkHeader* slot(void* base, int src, uint64_t n) const {
    return reinterpret_cast<ChunkHeader*>(static_cast<char*>(base) + slotOffset(src, n));
  }
  RingCtrl* shadow(void* base, int dst) const {
    return reinterpret_cast<RingCtrl*>(static_cast<char*>(base) + shadowOffset(dst));
  }
  ChunkHeader* staging(void* base, int index, uint64_t n) const {
    return reinterpret_cast<ChunkHeader*>(static_cast<char*>(base) + stagingOffset(index, n));
  }
};

inline uint64_t loadAcquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void storeRelease(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

}  // namespace host
}  // namespace ep
