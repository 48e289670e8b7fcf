// What crosses the bootstrap between ranks: the endpoint of a connection.
// Fixed-width fields in the machine's byte order (the ranks of a job run on
// one architecture); magic and version catch a blob from another transport
// or another build.
#pragma once

#include <cstdint>

namespace ibv {

constexpr uint32_t kEndpointMagic = 0x65704942u;  // 'epIB'
constexpr uint16_t kEndpointVersion = 1;
// WireEndpoint.flags: the side that made it posts receives for its signals,
// so they may come as RDMA WRITE WITH IMMEDIATE and wake it (wake.cc).
constexpr uint16_t kEndpointWakes = 0x1;
// The side that made it sends its signals WITH IMMEDIATE to a peer that asks
// (kEndpointWakes). A module from before the completion channel sets neither:
// its signals wake nobody, so a rank that waits for it must not sleep long.
constexpr uint16_t kEndpointSendsImm = 0x2;

struct WireEndpoint {
  uint32_t magic;
  uint16_t version;
  uint8_t mode;  // 0: endpoint exchange, 1: rdma_cm
  uint8_t roce;  // link layer Ethernet
  int32_t rank;  // who made it
  int32_t peer;  // for whom
  int32_t cls;
  uint32_t nqps;
  uint16_t lid;
  uint8_t port;
  uint8_t mtu;  // enum ibv_mtu
  int32_t gid_index;
  uint8_t gid[16];
  uint64_t ka_addr;  // where the peer's keepalive writes land
  uint32_t ka_rkey;
  uint32_t ipv4;     // rdma_cm: the listener's address (network order)
  uint16_t cm_port;  // rdma_cm: the listener's port (network order)
  uint16_t flags;    // kEndpointWakes; 0 from a module without a completion channel
  uint32_t qpn[16];  // endpoint exchange: each QP's number and first PSN
  uint32_t psn[16];
  char device[32];
};

}  // namespace ibv
