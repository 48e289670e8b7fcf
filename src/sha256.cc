#include "sha256.h"

#include <cstring>

namespace ep {

namespace {

// The first 32 bits of the fractional parts of the cube roots of the first 64
// primes (FIPS 180-4, 4.2.2).
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// Square roots of the first 8 primes (4.2.2 and 5.3.3).
constexpr uint32_t kInitial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t loadBigEndian(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

inline void storeBigEndian(uint32_t v, uint8_t* p) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}

}  // namespace

void Sha256::reset() {
  memcpy(state_, kInitial, sizeof(state_));
  buffered_ = 0;
  total_bytes_ = 0;
}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (size_t t = 0; t < 16; t++) w[t] = loadBigEndian(p + 4 * t);
  for (int t = 16; t < 64; t++) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; t++) {
    const uint32_t sum1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t t1 = h + sum1 + choose + kRound[t] + w[t];
    const uint32_t sum0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = sum0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_bytes_ += len;
  if (buffered_ > 0) {
    const size_t take = len < kSha256BlockBytes - buffered_ ? len : kSha256BlockBytes - buffered_;
    memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    len -= take;
    if (buffered_ < kSha256BlockBytes) return;
    block(buf_);
    buffered_ = 0;
  }
  for (; len >= kSha256BlockBytes; p += kSha256BlockBytes, len -= kSha256BlockBytes) block(p);
  memcpy(buf_, p, len);
  buffered_ = len;
}

void Sha256::finish(uint8_t out[kSha256Bytes]) {
  // Padding (5.1.1): a 1 bit, zeros up to 56 bytes into a block, then the
  // message length in bits as a 64-bit big-endian number.
  const uint64_t bits = total_bytes_ * 8;
  uint8_t pad[kSha256BlockBytes] = {0x80};
  const size_t end = kSha256BlockBytes - 8;  // where the length goes in the last block
  update(pad, buffered_ < end ? end - buffered_ : kSha256BlockBytes + end - buffered_);
  uint8_t length[8];
  for (size_t i = 0; i < 8; i++) length[i] = uint8_t(bits >> (56 - 8 * i));
  update(length, 8);
  for (size_t i = 0; i < 8; i++) storeBigEndian(state_[i], out + 4 * i);
  secureZero(buf_, sizeof(buf_));
}

void sha256(const void* data, size_t len, uint8_t out[kSha256Bytes]) {
  Sha256 h;
  h.update(data, len);
  h.finish(out);
}

HmacSha256::HmacSha256(const void* key, size_t key_len) {
  // A key longer than a block is replaced by its digest (RFC 2104, 2).
  uint8_t block_key[kSha256BlockBytes] = {};
  if (key_len > kSha256BlockBytes) sha256(key, key_len, block_key);
  else if (key_len > 0) memcpy(block_key, key, key_len);
  uint8_t inner_pad[kSha256BlockBytes];
  for (size_t i = 0; i < kSha256BlockBytes; i++) {
    inner_pad[i] = block_key[i] ^ 0x36;
    outer_pad_[i] = block_key[i] ^ 0x5c;
  }
  inner_.update(inner_pad, sizeof(inner_pad));
  secureZero(inner_pad, sizeof(inner_pad));
  secureZero(block_key, sizeof(block_key));
}

HmacSha256::~HmacSha256() { secureZero(outer_pad_, sizeof(outer_pad_)); }

void HmacSha256::finish(uint8_t out[kSha256Bytes]) {
  uint8_t inner_digest[kSha256Bytes];
  inner_.finish(inner_digest);
  Sha256 outer;
  outer.update(outer_pad_, sizeof(outer_pad_));
  outer.update(inner_digest, sizeof(inner_digest));
  outer.finish(out);
  secureZero(inner_digest, sizeof(inner_digest));
}

bool constantTimeEqual(const void* a, const void* b, size_t len) {
  // Every byte is read whatever came before; volatile keeps the compiler from
  // turning the loop into an early-exit memcmp.
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < len; i++) diff = uint8_t(diff | (x[i] ^ y[i]));
  return diff == 0;
}

void secureZero(void* p, size_t len) {
  volatile uint8_t* q = static_cast<volatile uint8_t*>(p);
  for (size_t i = 0; i < len; i++) q[i] = 0;
}

}  // namespace ep
