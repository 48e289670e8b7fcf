// Bootstrap: how ranks find each other without MPI.
//
// epGetUniqueId() starts a root listener (a thread of the calling process) and
// returns its address, a job nonce and the job's secret key in the 128-byte
// unique id. Each rank connects to the root, proves that it holds the key and
// sends its own listening address; once all nranks arrived the root tells
// every rank the address of its ring successor, and the ranks form a TCP ring
// (each link opened with the same proof). Collectives (allgather, barrier) run
// over the ring. Every listening socket is a GuardedListener
// (guarded_listener.h): no stranger can stall or join (docs/SEMANTICS.md,
// "Bootstrap security").
//
// Every wait honours the timeout and the abort flag: a rank that never arrives
// gives epTimeout with a message naming it, within timeout_ms; setting *abort
// (epCommAbort) makes blocked calls return epAborted promptly.
#pragma once

#include <atomic>
#include <cstddef>

#include <string>

#include "bootstrap_auth.h"
#include "guarded_listener.h"
#include "moeep.h"
#include "socket.h"

struct epComm;

namespace ep {

struct Bootstrap;

// Fills *id with a fresh root address + magic and starts the root listener in
// this process. Honours EP_COMM_ID (host:port to listen on), EP_SOCKET_IFNAME and
// EP_SOCKET_FAMILY. The root thread exits by itself once every rank has been
// served, or after its own timeout (EP_TIMEOUT_MS) if some never arrive.
// honour_comm_id = false ignores EP_COMM_ID: for the ranks of one process
// (epCommInitAll), whose id never leaves it, so that they do not take the
// job's address (which another process of the job may be serving).
epResult_t bootstrapGetUniqueId(epUniqueId* id, bool honour_comm_id = true);

// True when id looks like one made by bootstrapGetUniqueId (magic check).
bool bootstrapIdValid(const epUniqueId& id);
// What id carries: the job's key and nonce, the root's address (any output
// may be NULL); false when id is not valid. For tests, which dial the root as
// strangers do and craft hellos as a rank of that job would.
bool bootstrapIdInfo(const epUniqueId& id, BootstrapKey* key, uint64_t* job, SocketAddress* root);

// What a listening socket of this job needs so that only the job's ranks get
// in: its key, nonce and the hello bound (EP_BOOTSTRAP_HELLO_MS). purpose
// tells its connections from other listeners' (hs::Purpose: network
// transports add their own value); name is for the log. The client side of
// such a connection is an hs::ClientHandshake with the same key and job.
ListenerOptions bootstrapListenerOptions(const Bootstrap* b, uint16_t purpose, const std::string& name);

// Testing: when set, called in a rank's process with its ring listener's
// address as soon as it listens (before the root learns it), so that a test
// can dial it as a stranger would. The library never sets it.
extern void (*g_ring_listening_hook)(int rank, const SocketAddress& addr);

// Joins the ring as `rank` of `nranks`. comm is used only to record errors (may
// be NULL). On epTimeout the message names the ranks that did not arrive.
// init_abort (may be NULL) aborts this init only; unlike abort_flag it is not
// kept for later calls (epCommInitAll's flag for ranks that will never come).
epResult_t bootstrapInit(const epUniqueId& id, int rank, int nranks, int timeout_ms,
                         const std::atomic<int>* abort_flag, struct epComm* comm, Bootstrap** out,
                         const std::atomic<int>* init_abort = nullptr);

// In-place allgather: data holds nranks slots of bytes_per_rank, this rank's own
// slot filled on entry; on return every slot is filled.
epResult_t bootstrapAllGather(Bootstrap* b, void* data, size_t bytes_per_rank);
epResult_t bootstrapBarrier(Bootstrap* b);

// This rank's init failed (result, text) after the ring formed: tells the
// successor, which passes it on around the ring, so that every rank waiting
// in a collective fails naming this rank and its reason instead of the
// neighbour that left after it. Best effort, waits at most about a second;
// the ring is unusable afterwards. A no-op after a failed collective (that
// failure was passed on already).
void bootstrapNotifyFailure(Bootstrap* b, epResult_t result, const char* text);

// Unblocks every call of b that is waiting (used by epCommAbort). Thread-safe.
void bootstrapAbort(Bootstrap* b);
// Closes the sockets and frees b. NULL is a no-op.
epResult_t bootstrapClose(Bootstrap* b);

}  // namespace ep
