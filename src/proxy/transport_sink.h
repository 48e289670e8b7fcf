// PutSink over a version-2 network transport's connections (one per peer,
// made and connected by the caller, who keeps them for the sink's life):
// what the proxy posts through outside tests.
#pragma once

#include <string>
#include <vector>

#include "moeep_transport.h"
#include "proxy/proxy.h"

namespace ep {
namespace proxy {

class TransportSink : public PutSink {
 public:
  // conns[peer] (null for this rank), handles[peer]: the peer's mem_handle of
  // the memory puts land in; mem: this rank's registered memory they come from.
  TransportSink(const epTransport_v2_t* t, void* tcomm, void* mem, std::vector<void*> conns,
                std::vector<std::vector<uint8_t>> handles)
      : t_(t), tcomm_(tcomm), mem_(mem), conns_(std::move(conns)), handles_(std::move(handles)) {}

  epResult_t put(int peer, size_t local, size_t remote, size_t bytes, size_t sig, uint64_t value,
                 uint64_t* request) override {
    if (conns_[size_t(peer)] == nullptr) return epInvalidArgument;  // this rank, or a peer not connected
    return t_->put(conns_[size_t(peer)], mem_, local, handles_[size_t(peer)].data(), remote, bytes, sig, value,
                   EP_PUT_SIGNAL, request);
  }
  epResult_t test(int peer, uint64_t request, int* done) override {
    if (conns_[size_t(peer)] == nullptr) return epInvalidArgument;
    return t_->test(conns_[size_t(peer)], request, done);
  }
  epResult_t progress(int* peer, std::string* why) override {
    const epResult_t res = t_->progress(tcomm_);
    if (res == epSuccess) return res;
    char msg[512] = "";
    *peer = -1;
    t_->last_error(tcomm_, peer, msg, sizeof(msg));
    *why = msg;
    return res;
  }

 private:
  const epTransport_v2_t* t_;
  void* tcomm_;
  void* mem_;
  std::vector<void*> conns_;
  std::vector<std::vector<uint8_t>> handles_;
};

}  // namespace proxy
}  // namespace ep
