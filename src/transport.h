// The transport registry: built-in transports and libmoeep-transport-NAME.so
// modules, filtered by EP_TRANSPORTS, each initialised once per process.
#pragma once

#include <string>
#include <vector>

#include "moeep_transport.h"

namespace ep {

struct TransportEntry {
  const char* name = nullptr;           // the table's name (never null)
  unsigned version = 0;                 // the table version this entry uses: 1, 2 or 3
  const epTransport_v1_t* table = nullptr;  // version 1: memory peers map (shm, cuda_ipc)
  const epTransport_v2_t* net = nullptr;    // versions 2 and 3: network transports (put with a signal)
  epResult_t (*wait)(void* comm, int timeout_us) = nullptr;  // version 3's wait (may be NULL)
  epResult_t (*drop_peer)(void* comm, int peer) = nullptr;   // version 3's drop_peer (may be NULL)
  void* ctx = nullptr;        // from init, when available
  bool available = false;     // init succeeded and EP_TRANSPORTS allows it
  std::string origin;         // "built-in" or the module's path
  std::string reason;         // why it is unavailable
};

// Registers a built-in transport (called from static initialisers).
void transportRegisterBuiltin(const epTransport_v1_t* table);

// Initialises the registry once; safe to call often, from any thread.
void transportsInit();
const std::vector<TransportEntry>& transportList();
// The available transport called name, or nullptr (with reason, if known).
const TransportEntry* transportFind(const char* name, std::string* reason = nullptr);
// A network transport's communicator context was opened / closed
// (comm_open / comm_close): finalize waits for none to be open.
void transportCommOpened();
void transportCommClosed();
// True when EP_TRANSPORTS is a list (not ^exclusions) that names name: the
// user asked for that transport, so its absence is an error, not a choice.
bool transportNamedByUser(const char* name);
// Clears / returns the last warning a transport logged on this thread: the
// cause to show when one of its calls fails.
void transportClearWarning();
const std::string& transportLastWarning();

}  // namespace ep

// In-tree transports define their table with this macro. Built into the
// library it registers the table at load time; built as a module it exports
// the table as epTransport_v1, the one symbol a module must have.
#ifdef EP_TRANSPORT_MODULE
#define EP_TRANSPORT_DEFINE(table) \
  extern "C" __attribute__((visibility("default"))) const epTransport_v1_t epTransport_v1 = table;
#else
#define EP_TRANSPORT_DEFINE(table)                                      \
  namespace {                                                            \
  struct TransportRegistrar_##table {                                    \
    TransportRegistrar_##table() { ::ep::transportRegisterBuiltin(&table); } \
  } transport_registrar_##table;                                         \
  }
#endif
