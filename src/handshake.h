// The authenticated hello that opens every connection to a listening socket
// of the bootstrap (the root's, the ranks' ring listeners, and those the
// network transports add), and the server's signed reply.
//
//   server -> client  Challenge  {magic, version, purpose, server nonce}   at once on accept
//   client -> server  HelloHead  {magic, version, purpose, job, server nonce (echoed),
//                                 client nonce, payload size} + payload + tag
//   server -> client  ReplyHead  {magic, status, payload size} + payload + tag
//
// tag = HMAC-SHA-256(job key, label || ...) over everything before it: the
// hello's covers the server's fresh nonce, so a hello recorded from an earlier
// job (or an earlier connection of this one) answers another challenge and is
// refused, whatever key that job had; the reply's covers both nonces, so the
// client knows its server holds the key too. Payloads are bounded
// (kMaxPayload): a peer that announces more is refused before anything more is
// read. Fields are in host byte order, as elsewhere in the bootstrap (every
// rank of a job runs the same build).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap_auth.h"
#include "socket.h"

namespace ep {
namespace hs {

constexpr uint16_t kVersion = 1;
constexpr size_t kNonceBytes = 16;
constexpr size_t kTagBytes = kSha256Bytes;
// The most a hello or a reply may carry after its head.
constexpr size_t kMaxPayload = 1024;

// What a listening socket is for; a hello for another purpose is refused (a
// rank that dials a ring port as if it were the root, say). Network
// transports add their own values.
enum Purpose : uint16_t { kPurposeRoot = 1, kPurposeRing = 2, kPurposeRecovery = 3 };
const char* purposeName(uint16_t purpose);

struct Challenge {
  uint32_t magic;
  uint16_t version;
  uint16_t purpose;
  uint8_t nonce[kNonceBytes];
};
static_assert(sizeof(Challenge) == 24, "wire format");

struct HelloHead {
  uint32_t magic;
  uint16_t version;
  uint16_t purpose;
  uint64_t job;  // the job's nonce from the unique id (not secret)
  uint8_t server_nonce[kNonceBytes];
  uint8_t client_nonce[kNonceBytes];
  uint32_t payload_bytes;
  uint32_t reserved;
};
static_assert(sizeof(HelloHead) == 56, "wire format");

struct ReplyHead {
  uint32_t magic;
  int32_t status;  // epResult_t; a refusal carries its reason as the payload
  uint32_t payload_bytes;
  uint32_t reserved;
};
static_assert(sizeof(ReplyHead) == 16, "wire format");

Challenge makeChallenge(uint16_t purpose, const uint8_t nonce[kNonceBytes]);

// What the client sends once it has the server's challenge.
std::vector<uint8_t> sealHello(const BootstrapKey& key, uint64_t job, uint16_t purpose,
                               const uint8_t server_nonce[kNonceBytes], const uint8_t client_nonce[kNonceBytes],
                               const void* payload, size_t len);
// The server's reply (success or refusal) to a hello with these nonces.
std::vector<uint8_t> sealReply(const BootstrapKey& key, const uint8_t server_nonce[kNonceBytes],
                               const uint8_t client_nonce[kNonceBytes], int32_t status, const void* payload,
                               size_t len);

// Server side. False with *why when a hello's head cannot start a valid hello
// (checked before its payload is read: a stranger never makes the server read
// more than kMaxPayload).
bool checkHelloHead(const HelloHead& head, uint16_t purpose, size_t max_payload, std::string* why);
// True when head at least begins as a moeep hello does (its magic).
bool looksLikeHello(const HelloHead& head);
// False as soon as the first len bytes of a hello (len may be less than the
// magic) cannot begin one: garbage is refused on its first bytes, without
// waiting for a whole head that may never come.
bool helloStartMatches(const uint8_t* p, size_t len);
// The first bytes of what a peer sent, printable, for messages.
std::string sampleOf(const uint8_t* p, size_t len);
// Whole hello (head, payload, tag). Why a hello is refused, in the order
// checked: it answers another challenge (a replay), its tag is not this
// job's key's (a wrong secret), or it is this key's but of another job.
enum class HelloVerdict { kValid, kReplayed, kBadTag, kOtherJob };
HelloVerdict verifyHello(const BootstrapKey& key, uint64_t job, const uint8_t server_nonce[kNonceBytes],
                         const uint8_t* hello, size_t len);

// The client's side of one connection, advanced without blocking as the
// socket allows: read the challenge, send the hello, read the reply.
class ClientHandshake {
 public:
  enum class State { kChallenge, kHello, kReplyHead, kReplyBody, kDone, kFailed };
  enum class Failure {
    kNone,
    kClosedBeforeChallenge,  // the server never took the connection (or is gone)
    kDropped,                // closed after its challenge, before a reply: its hello deadline, a flood
    kForeign,                // the peer does not speak this protocol (what it sent is in `why`)
    kBadReply,               // a reply too large, or a success whose tag is not the job's
    kIo                      // a socket error (io)
  };

  void start(int fd, const BootstrapKey& key, uint64_t job, uint16_t purpose, const void* payload, size_t len);
  State state() const { return state_; }
  // What to poll the socket for next.
  short pollEvents() const;
  // Moves on as far as the socket allows.
  State advance();

  Failure failure = Failure::kNone;
  IoResult io;      // the socket error of kIo
  std::string why;  // words for kForeign / kBadReply
  // Once kDone: the reply. authentic is false for a refusal whose tag does not
  // verify (the server does not hold this rank's key): its status and text may
  // be shown, never acted on beyond failing.
  int32_t status = 0;
  bool authentic = false;
  std::vector<uint8_t> reply_payload;

 private:
  State fail(Failure f, const std::string& text);
  bool receive(size_t want);  // reads towards in_.size() == want; false on an end (state set)

  int fd_ = -1;
  BootstrapKey key_;
  uint64_t job_ = 0;
  uint16_t purpose_ = 0;
  std::vector<uint8_t> payload_;
  uint8_t server_nonce_[kNonceBytes] = {};
  uint8_t client_nonce_[kNonceBytes] = {};
  std::vector<uint8_t> out_;
  size_t sent_ = 0;
  std::vector<uint8_t> in_;
  State state_ = State::kFailed;
};

// Drives h to kDone or kFailed, sleeping in poll() slices: kOk once it
// ended (look at h), kTimeout / kAborted when the wait ended first.
IoResult runClientHandshake(ClientHandshake* h, int fd, const Wait& wait);

}  // namespace hs
}  // namespace ep
