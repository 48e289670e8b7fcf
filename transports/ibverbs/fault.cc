// EP_IB_FAULT=KIND[:N]: a fault made to happen on a live connection at the
// N-th put of each communicator of this process (default 8), to show that
// each ends in an error naming the peer, never in a hang. The faults a live
// device seldom shows on demand:
//   qp_error     the connection's QPs are moved to the error state: what is
//                posted then flushes with an error
//   cqe_error    the put's completion reads as failed (as a NIC's would)
//   bad_rkey     the put uses a wrong remote key: the peer's NIC refuses the
//                write (a real remote access error, both sides' QPs fail)
//   device_lost  the device stops answering: posts fail, completion queues
//                cannot be polled, as after a NIC reset or a hot unplug
//   port_down    the port's asynchronous event IBV_EVENT_PORT_ERR, as when
//                its link goes down (a cable, a switch port)
// The peer sees the faulted rank go (its QPs fail or vanish) through its
// keepalive writes, or rdma_cm's DISCONNECTED.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ib.h"

namespace ibv {

namespace {

std::atomic<bool> g_lost{false};

// port_down: one made-up IBV_EVENT_PORT_ERR comes before the device's own events.
std::atomic<int> g_port_down{0};  // the port, until the event was read
int (*g_real_get_async_event)(struct ibv_context*, struct ibv_async_event*) = nullptr;
void (*g_real_ack_async_event)(struct ibv_async_event*) = nullptr;
struct ibv_async_event g_made_up;

int portDownGetAsyncEvent(struct ibv_context* ctx, struct ibv_async_event* ev) {
  const int port = g_port_down.exchange(0);
  if (port == 0) return g_real_get_async_event(ctx, ev);
  memset(ev, 0, sizeof(*ev));
  ev->event_type = IBV_EVENT_PORT_ERR;
  ev->element.port_num = port;
  g_made_up = *ev;
  return 0;
}
void portDownAckAsyncEvent(struct ibv_async_event* ev) {
  if (ev->event_type == IBV_EVENT_PORT_ERR && ev->element.port_num == g_made_up.element.port_num &&
      g_made_up.event_type == IBV_EVENT_PORT_ERR) {
    g_made_up.event_type = IBV_EVENT_DEVICE_FATAL;  // acknowledged: forget it
    return;
  }
  g_real_ack_async_event(ev);
}

int lostPostSend(struct ibv_qp*, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  *bad = wr;
  return EIO;
}
int lostPollCq(struct ibv_cq*, int, struct ibv_wc*) {
  errno = EIO;
  return -1;
}

}  // namespace

const char* faultName(Fault f) {
  switch (f) {
    case Fault::kQpError: return "qp_error";
    case Fault::kCqeError: return "cqe_error";
    case Fault::kBadRkey: return "bad_rkey";
    case Fault::kDeviceLost: return "device_lost";
    case Fault::kPortDown: return "port_down";
    default: return "none";
  }
}

bool deviceLost() { return g_lost.load(std::memory_order_relaxed); }

void parseFault(Context* c, const char* spec) {
  if (spec == nullptr || *spec == '\0') return;
  std::string s(spec);
  const size_t colon = s.find(':');
  if (colon != std::string::npos) {
    const long n = atol(s.c_str() + colon + 1);
    if (n >= 1) c->fault_after = uint64_t(n);
    s.resize(colon);
  }
  for (Fault f : {Fault::kQpError, Fault::kCqeError, Fault::kBadRkey, Fault::kDeviceLost, Fault::kPortDown})
    if (s == faultName(f)) c->fault = f;
  if (c->fault == Fault::kNone)
    logf(c, epTransportLogWarn, "EP_IB_FAULT=%s: not a fault (qp_error, cqe_error, bad_rkey, device_lost, port_down[:N]); ignored",
         spec);
  else
    logf(c, epTransportLogWarn, "EP_IB_FAULT: %s at put %llu of each communicator (testing)", faultName(c->fault),
         (unsigned long long)c->fault_after);
}

void faultAtPut(Conn* conn, uint32_t* rkey, bool* force_signal) {
  Comm* comm = conn->comm;
  Context* c = comm->ctx;
  if (c->fault == Fault::kNone || comm->fault_done || comm->puts < c->fault_after) return;
  comm->fault_done = true;
  logf(c, epTransportLogWarn, "EP_IB_FAULT=%s: now, at put %llu, on the connection to rank %d (%s)",
       faultName(c->fault), (unsigned long long)comm->puts, conn->peer, className(conn->cls));
  switch (c->fault) {
    case Fault::kQpError:
      for (Qp& q : conn->qps) {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof(a));
        a.qp_state = IBV_QPS_ERR;
        c->v.modify_qp(q.qp, &a, IBV_QP_STATE);
      }
      break;
    case Fault::kCqeError:
      conn->qps[0].fault_cqe = true;
      conn->qps[0].fault_wr = conn->qps[0].posted;
      *force_signal = true;
      break;
    case Fault::kBadRkey:
      *rkey ^= 0x00a5a500u;
      break;
    case Fault::kDeviceLost:
      g_lost = true;
      c->v.post_send = lostPostSend;
      c->v.poll_cq = lostPollCq;
      break;
    case Fault::kPortDown:
      if (g_real_get_async_event == nullptr) {
        g_real_get_async_event = c->v.get_async_event;
        g_real_ack_async_event = c->v.ack_async_event;
      }
      c->v.get_async_event = portDownGetAsyncEvent;
      c->v.ack_async_event = portDownAckAsyncEvent;
      g_port_down = comm->port.port;
      break;
    default:
      break;
  }
}

}  // namespace ibv
