// Low-latency dispatch and combine of the host backend (the reference for the
// GPU kernels): a token crosses to each destination rank once, with its
// expert ids and weights, and is expanded there into the expert-major layout;
// combine forms each rank's weighted partial sum of a token where the expert
// outputs lie and sends one float32 row per (token, rank) home.
#pragma once

#include "../backend_comm.h"
#include "../config.h"
#include "../handle.h"
#include "exchange.h"

namespace ep {
namespace host {

// Bytes of the largest low-latency record (for the ring geometry).
size_t llRecordBytes(const Config& cfg);

epResult_t llDispatch(const BackendComm& comm, Exchanger& ex, const epLowLatencyDispatchArgs_t& args, epHandle* h,
                      bool send_only);
epResult_t llCombine(const BackendComm& comm, Exchanger& ex, const epLowLatencyCombineArgs_t& args, epHandle* h,
                     bool send_only);
epResult_t llComplete(const BackendComm& comm, epHandle* h);
void llRelease(epHandle* h);

}  // namespace host
}  // namespace ep
