// SHA-256 and HMAC-SHA-256 of the bootstrap's authenticator (src/sha256.cc)
// against the published vectors: the FIPS 180-4 examples (and the one-million
// 'a' message of its earlier editions) and every HMAC-SHA-256 case of RFC 4231;
// also the key derivation of EP_COMM_SECRET (src/bootstrap_auth.cc) and the
// constant-time comparison.
#include <unistd.h>

#include <string>
#include <vector>

#include "bootstrap_auth.h"
#include "common.h"
#include "sha256.h"

namespace {

std::string hex(const uint8_t* p, size_t len) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < len; i++) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

std::string sha256Hex(const std::string& msg) {
  uint8_t out[ep::kSha256Bytes];
  ep::sha256(msg.data(), msg.size(), out);
  return hex(out, sizeof(out));
}

std::string hmacHex(const std::string& key, const std::string& msg) {
  uint8_t out[ep::kSha256Bytes];
  ep::HmacSha256 mac(key.data(), key.size());
  mac.update(msg.data(), msg.size());
  mac.finish(out);
  return hex(out, sizeof(out));
}

void sha256_fips_examples(void**) {
  assert_string_equal(sha256Hex("abc").c_str(),
                      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  assert_string_equal(sha256Hex("").c_str(),
                      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // 448 bits: the padding needs a block of its own.
  assert_string_equal(sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").c_str(),
                      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  assert_string_equal(sha256Hex(std::string(1000000, 'a')).c_str(),
                      "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The digest does not depend on how the message is cut into updates.
void sha256_updates_in_pieces(void**) {
  std::string msg;
  for (int i = 0; i < 300; i++) msg += char(i * 37 + 11);
  uint8_t whole[ep::kSha256Bytes];
  ep::sha256(msg.data(), msg.size(), whole);
  for (size_t cut = 0; cut <= msg.size(); cut += 7) {
    ep::Sha256 h;
    h.update(msg.data(), cut);
    h.update(msg.data() + cut, msg.size() - cut);
    uint8_t pieces[ep::kSha256Bytes];
    h.finish(pieces);
    if (memcmp(whole, pieces, sizeof(whole)) != 0) print_error("cut at %zu\n", cut);
    assert_memory_equal(whole, pieces, sizeof(whole));
  }
}

void hmac_rfc4231(void**) {
  // Test cases 1-7 of RFC 4231, section 4.
  assert_string_equal(hmacHex(std::string(20, '\x0b'), "Hi There").c_str(),
                      "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  assert_string_equal(hmacHex("Jefe", "what do ya want for nothing?").c_str(),
                      "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  assert_string_equal(hmacHex(std::string(20, '\xaa'), std::string(50, '\xdd')).c_str(),
                      "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; i++) key4 += char(i);
  assert_string_equal(hmacHex(key4, std::string(50, '\xcd')).c_str(),
                      "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Case 5 is truncated to 128 bits.
  assert_string_equal(hmacHex(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32).c_str(),
                      "a3b6167473100ee06e0c796c2955552b");
  // Cases 6 and 7: a key longer than a block is hashed first.
  assert_string_equal(
      hmacHex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First").c_str(),
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  assert_string_equal(hmacHex(std::string(131, '\xaa'),
                              "This is a test using a larger than block-size key and a larger than block-size "
                              "data. The key needs to be hashed before being used by the HMAC algorithm.")
                          .c_str(),
                      "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

void constant_time_equal_compares_every_byte(void**) {
  uint8_t a[40], b[40];
  for (int i = 0; i < 40; i++) a[i] = b[i] = uint8_t(i * 3);
  assert_true(ep::constantTimeEqual(a, b, sizeof(a)));
  assert_true(ep::constantTimeEqual(a, b, 0));
  for (int at : {0, 17, 39}) {
    b[at] ^= 0x40;
    assert_false(ep::constantTimeEqual(a, b, sizeof(a)));
    b[at] ^= 0x40;
  }
}

// EP_COMM_SECRET's key: the same secret gives the same key on every rank,
// another secret another key, and the key is not the secret itself.
void comm_secret_key_derivation(void**) {
  ep::BootstrapKey k1, k2, k3;
  ep::deriveBootstrapKey("correct horse battery staple", 28, &k1);
  ep::deriveBootstrapKey("correct horse battery staple", 28, &k2);
  ep::deriveBootstrapKey("correct horse battery stapler", 29, &k3);
  assert_memory_equal(k1.bytes, k2.bytes, sizeof(k1.bytes));
  assert_memory_not_equal(k1.bytes, k3.bytes, sizeof(k1.bytes));
  uint8_t raw[ep::kSha256Bytes] = {};
  memcpy(raw, "correct horse battery staple", 28);
  assert_memory_not_equal(k1.bytes, raw, sizeof(raw));
}

void comm_secret_from_file_or_text(void**) {
  char path[] = "/tmp/moeep-secret-XXXXXX";
  const int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char text[] = "s3cret-in-a-file\n";
  assert_int_equal(write(fd, text, sizeof(text) - 1), ssize_t(sizeof(text) - 1));
  close(fd);
  std::string secret, error;
  assert_true(ep::readCommSecret((std::string("file:") + path).c_str(), &secret, &error));
  assert_string_equal(secret.c_str(), "s3cret-in-a-file");  // the line end is not part of it
  assert_true(ep::readCommSecret("literal", &secret, &error));
  assert_string_equal(secret.c_str(), "literal");
  unlink(path);
  assert_false(ep::readCommSecret((std::string("file:") + path).c_str(), &secret, &error));
  assert_contains(error.c_str(), "cannot be opened");
  assert_false(ep::readCommSecret("file:", &secret, &error));
  assert_contains(error.c_str(), "names no file");
}

void random_keys_differ(void**) {
  ep::BootstrapKey a, b;
  std::string error;
  assert_true(ep::randomBootstrapKey(&a, &error));
  assert_true(ep::randomBootstrapKey(&b, &error));
  assert_true(a.authenticated && b.authenticated);
  assert_memory_not_equal(a.bytes, b.bytes, sizeof(a.bytes));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sha256_fips_examples),
      cmocka_unit_test(sha256_updates_in_pieces),
      cmocka_unit_test(hmac_rfc4231),
      cmocka_unit_test(constant_time_equal_compares_every_byte),
      cmocka_unit_test(comm_secret_key_derivation),
      cmocka_unit_test(comm_secret_from_file_or_text),
      cmocka_unit_test(random_keys_differ),
  };
  return cmocka_run_group_tests_name("sha256", tests, nullptr, nullptr);
}
