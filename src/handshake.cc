#include "handshake.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace ep {
namespace hs {

namespace {

constexpr uint32_t kChallengeMagic = 0x65704368u;  // 'epCh'
constexpr uint32_t kHelloMagic = 0x65704865u;      // 'epHe'
constexpr uint32_t kReplyMagic = 0x65705265u;      // 'epRe'
// Each tag is over its own label first, so that no tag of one kind of
// message passes as another's (a server's reply sent back as a hello).
constexpr char kHelloLabel[] = "moeep bootstrap hello v1";
constexpr char kReplyLabel[] = "moeep bootstrap reply v1";

void helloTag(const BootstrapKey& key, const uint8_t* hello_without_tag, size_t len, uint8_t tag[kTagBytes]) {
  HmacSha256 mac(key.bytes, sizeof(key.bytes));
  mac.update(kHelloLabel, sizeof(kHelloLabel) - 1);
  mac.update(hello_without_tag, len);
  mac.finish(tag);
}

void replyTag(const BootstrapKey& key, const uint8_t server_nonce[kNonceBytes], const uint8_t client_nonce[kNonceBytes],
              const uint8_t* reply_without_tag, size_t len, uint8_t tag[kTagBytes]) {
  HmacSha256 mac(key.bytes, sizeof(key.bytes));
  mac.update(kReplyLabel, sizeof(kReplyLabel) - 1);
  mac.update(server_nonce, kNonceBytes);
  mac.update(client_nonce, kNonceBytes);
  mac.update(reply_without_tag, len);
  mac.finish(tag);
}

}  // namespace

std::string sampleOf(const uint8_t* p, size_t len) {
  std::string s;
  for (size_t i = 0; i < len && i < 24; i++) s += (p[i] >= 0x20 && p[i] < 0x7f) ? char(p[i]) : '.';
  return "\"" + s + "\"";
}

bool helloStartMatches(const uint8_t* p, size_t len) {
  const uint32_t magic = kHelloMagic;
  return memcmp(p, &magic, len < sizeof(magic) ? len : sizeof(magic)) == 0;
}

const char* purposeName(uint16_t purpose) {
  switch (purpose) {
    case kPurposeRoot: return "bootstrap root";
    case kPurposeRing: return "bootstrap ring";
    case kPurposeRecovery: return "recovery (shrink)";
    default: return "unknown purpose";
  }
}

Challenge makeChallenge(uint16_t purpose, const uint8_t nonce[kNonceBytes]) {
  Challenge c;
  memset(&c, 0, sizeof(c));
  c.magic = kChallengeMagic;
  c.version = kVersion;
  c.purpose = purpose;
  memcpy(c.nonce, nonce, kNonceBytes);
  return c;
}

std::vector<uint8_t> sealHello(const BootstrapKey& key, uint64_t job, uint16_t purpose,
                               const uint8_t server_nonce[kNonceBytes], const uint8_t client_nonce[kNonceBytes],
                               const void* payload, size_t len) {
  HelloHead head;
  memset(&head, 0, sizeof(head));
  head.magic = kHelloMagic;
  head.version = kVersion;
  head.purpose = purpose;
  head.job = job;
  memcpy(head.server_nonce, server_nonce, kNonceBytes);
  memcpy(head.client_nonce, client_nonce, kNonceBytes);
  head.payload_bytes = uint32_t(len);
  std::vector<uint8_t> out(sizeof(head) + len + kTagBytes);
  memcpy(out.data(), &head, sizeof(head));
  if (len > 0) memcpy(out.data() + sizeof(head), payload, len);
  helloTag(key, out.data(), sizeof(head) + len, out.data() + sizeof(head) + len);
  return out;
}

std::vector<uint8_t> sealReply(const BootstrapKey& key, const uint8_t server_nonce[kNonceBytes],
                               const uint8_t client_nonce[kNonceBytes], int32_t status, const void* payload,
                               size_t len) {
  ReplyHead head;
  memset(&head, 0, sizeof(head));
  head.magic = kReplyMagic;
  head.status = status;
  head.payload_bytes = uint32_t(len);
  std::vector<uint8_t> out(sizeof(head) + len + kTagBytes);
  memcpy(out.data(), &head, sizeof(head));
  if (len > 0) memcpy(out.data() + sizeof(head), payload, len);
  replyTag(key, server_nonce, client_nonce, out.data(), sizeof(head) + len, out.data() + sizeof(head) + len);
  return out;
}

bool checkHelloHead(const HelloHead& head, uint16_t purpose, size_t max_payload, std::string* why) {
  if (head.magic != kHelloMagic) {
    *why = "not a moeep hello (it began " + sampleOf(reinterpret_cast<const uint8_t*>(&head), sizeof(head)) + ")";
    return false;
  }
  if (head.version != kVersion) {
    *why = "hello of protocol version " + std::to_string(head.version) + ", this library speaks " +
           std::to_string(kVersion) + " (every rank must run the same libmoeep)";
    return false;
  }
  if (head.purpose != purpose) {
    *why = std::string("a hello for a ") + purposeName(head.purpose) + " port, this is a " + purposeName(purpose) +
           " port";
    return false;
  }
  if (head.payload_bytes > max_payload) {
    *why = "a hello announcing " + std::to_string(head.payload_bytes) + " bytes, more than the " +
           std::to_string(max_payload) + " such a hello may carry";
    return false;
  }
  return true;
}

bool looksLikeHello(const HelloHead& head) { return head.magic == kHelloMagic; }

HelloVerdict verifyHello(const BootstrapKey& key, uint64_t job, const uint8_t server_nonce[kNonceBytes],
                         const uint8_t* hello, size_t len) {
  HelloHead head;
  memcpy(&head, hello, sizeof(head));
  // The nonce echoed is not secret: comparing it first only names a replay
  // as such. The tag decides, compared in constant time.
  if (!constantTimeEqual(head.server_nonce, server_nonce, kNonceBytes)) return HelloVerdict::kReplayed;
  uint8_t tag[kTagBytes];
  helloTag(key, hello, len - kTagBytes, tag);
  const bool tag_ok = constantTimeEqual(tag, hello + len - kTagBytes, kTagBytes);
  secureZero(tag, sizeof(tag));
  if (!tag_ok) return HelloVerdict::kBadTag;
  return head.job == job ? HelloVerdict::kValid : HelloVerdict::kOtherJob;
}

// ---- Client -------------------------------------------------------------------

void ClientHandshake::start(int fd, const BootstrapKey& key, uint64_t job, uint16_t purpose, const void* payload,
                            size_t len) {
  fd_ = fd;
  key_ = key;
  job_ = job;
  purpose_ = purpose;
  payload_.assign(static_cast<const uint8_t*>(payload), static_cast<const uint8_t*>(payload) + len);
  std::string ignored;
  if (!osRandomBytes(client_nonce_, sizeof(client_nonce_), &ignored)) {
    // The client's nonce makes the reply fresh; it needs to be new, not secret.
    static std::atomic<uint64_t> counter{0};
    const uint64_t v[2] = {uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()),
                           counter.fetch_add(1) ^ (uint64_t(getpid()) << 32)};
    memcpy(client_nonce_, v, sizeof(client_nonce_));
  }
  failure = Failure::kNone;
  io = IoResult();
  why.clear();
  status = 0;
  authentic = false;
  reply_payload.clear();
  out_.clear();
  sent_ = 0;
  in_.clear();
  state_ = State::kChallenge;
}

short ClientHandshake::pollEvents() const { return state_ == State::kHello ? POLLOUT : POLLIN; }

ClientHandshake::State ClientHandshake::fail(Failure f, const std::string& text) {
  failure = f;
  why = text;
  state_ = State::kFailed;
  return state_;
}

bool ClientHandshake::receive(size_t want) {
  while (in_.size() < want) {
    uint8_t buf[512];
    const size_t ask = want - in_.size() < sizeof(buf) ? want - in_.size() : sizeof(buf);
    const ssize_t n = ::recv(fd_, buf, ask, MSG_DONTWAIT);
    if (n > 0) {
      in_.insert(in_.end(), buf, buf + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n == 0 || errno == ECONNRESET || errno == EPIPE) {
      fail(state_ == State::kChallenge ? Failure::kClosedBeforeChallenge : Failure::kDropped, "");
      io.status = IoStatus::kClosed;
      return false;
    }
    io.status = IoStatus::kError;
    io.sys_errno = errno;
    fail(Failure::kIo, "");
    return false;
  }
  return true;
}

ClientHandshake::State ClientHandshake::advance() {
  for (;;) {
    switch (state_) {
      case State::kChallenge: {
        if (!receive(sizeof(Challenge))) return state_;
        Challenge c;
        memcpy(&c, in_.data(), sizeof(c));
        if (c.magic != kChallengeMagic || c.version != kVersion)
          return fail(Failure::kForeign, "it sent " + sampleOf(in_.data(), in_.size()) + ", not a moeep challenge");
        if (c.purpose != purpose_)
          return fail(Failure::kForeign, std::string("it is a ") + purposeName(c.purpose) + " port, not a " +
                                             purposeName(purpose_) + " port");
        memcpy(server_nonce_, c.nonce, kNonceBytes);
        out_ = sealHello(key_, job_, purpose_, server_nonce_, client_nonce_, payload_.data(), payload_.size());
        in_.clear();
        state_ = State::kHello;
        break;
      }
      case State::kHello: {
        while (sent_ < out_.size()) {
          const ssize_t n = ::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
          if (n > 0) {
            sent_ += size_t(n);
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return state_;
          if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) {
            io.status = IoStatus::kClosed;
            return fail(Failure::kDropped, "");
          }
          io.status = IoStatus::kError;
          io.sys_errno = errno;
          return fail(Failure::kIo, "");
        }
        state_ = State::kReplyHead;
        break;
      }
      case State::kReplyHead: {
        if (!receive(sizeof(ReplyHead))) return state_;
        ReplyHead h;
        memcpy(&h, in_.data(), sizeof(h));
        if (h.magic != kReplyMagic)
          return fail(Failure::kForeign, "it answered " + sampleOf(in_.data(), in_.size()) + ", not a moeep reply");
        if (h.payload_bytes > kMaxPayload)
          return fail(Failure::kBadReply, "a reply announcing " + std::to_string(h.payload_bytes) +
                                              " bytes, more than the " + std::to_string(kMaxPayload) +
                                              " a reply may carry");
        state_ = State::kReplyBody;
        break;
      }
      case State::kReplyBody: {
        ReplyHead h;
        memcpy(&h, in_.data(), sizeof(h));
        const size_t total = sizeof(h) + h.payload_bytes + kTagBytes;
        if (!receive(total)) return state_;
        uint8_t tag[kTagBytes];
        replyTag(key_, server_nonce_, client_nonce_, in_.data(), total - kTagBytes, tag);
        authentic = constantTimeEqual(tag, in_.data() + total - kTagBytes, kTagBytes);
        status = h.status;
        reply_payload.assign(in_.begin() + sizeof(h), in_.begin() + sizeof(h) + h.payload_bytes);
        // A success is acted on (an address to dial): only from the key's holder.
        if (status == 0 && !authentic)
          return fail(Failure::kBadReply, "its reply does not carry this job's authenticator");
        state_ = State::kDone;
        return state_;
      }
      case State::kDone:
      case State::kFailed:
        return state_;
    }
  }
}

IoResult runClientHandshake(ClientHandshake* h, int fd, const Wait& wait) {
  for (;;) {
    const ClientHandshake::State s = h->advance();
    if (s == ClientHandshake::State::kDone || s == ClientHandshake::State::kFailed) return IoResult();
    if (wait.aborted()) {
      IoResult r;
      r.status = IoStatus::kAborted;
      return r;
    }
    if (wait.expired()) {
      IoResult r;
      r.status = IoStatus::kTimeout;
      return r;
    }
    pollfd pfd = {fd, h->pollEvents(), 0};
    if (::poll(&pfd, 1, wait.sliceMs()) < 0 && errno != EINTR) {
      IoResult r;
      r.status = IoStatus::kError;
      r.sys_errno = errno;
      return r;
    }
  }
}

}  // namespace hs
}  // namespace ep
