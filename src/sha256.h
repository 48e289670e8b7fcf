// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104) for the bootstrap's
// authenticator, with a constant-time comparison of tags. Small and
// self-contained so that the core needs no crypto library; speed is no
// concern (a handful of short messages per connection). Tested against the
// FIPS 180-4 examples and the RFC 4231 vectors (test_sha256).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ep {

constexpr size_t kSha256Bytes = 32;
constexpr size_t kSha256BlockBytes = 64;

class Sha256 {
 public:
  Sha256() { reset(); }
  void reset();
  void update(const void* data, size_t len);
  // Writes the digest and leaves the object to be reset before reuse.
  void finish(uint8_t out[kSha256Bytes]);

 private:
  void block(const uint8_t* p);

  uint32_t state_[8] = {};
  uint8_t buf_[kSha256BlockBytes] = {};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

void sha256(const void* data, size_t len, uint8_t out[kSha256Bytes]);

// HMAC-SHA-256 over the concatenation of the parts (update as often as needed).
class HmacSha256 {
 public:
  HmacSha256(const void* key, size_t key_len);
  ~HmacSha256();
  void update(const void* data, size_t len) { inner_.update(data, len); }
  void finish(uint8_t out[kSha256Bytes]);

 private:
  Sha256 inner_;
  uint8_t outer_pad_[kSha256BlockBytes];
};

// True when a and b hold the same len bytes. Its time depends on len only,
// not on where they differ, so that a peer timing refusals learns nothing of a
// tag it guessed.
bool constantTimeEqual(const void* a, const void* b, size_t len);

// Overwrites len bytes in a way the compiler may not drop as a dead store
// (secrets on the stack before they go out of scope).
void secureZero(void* p, size_t len);

}  // namespace ep
