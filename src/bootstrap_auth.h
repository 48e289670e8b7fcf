// The job's bootstrap key: what a peer proves it holds before any rank acts on
// what it says (docs/SEMANTICS.md, "Bootstrap security").
//
// An id from epGetUniqueId carries a key drawn from the OS's random source.
// With EP_COMM_ID every rank derives the id from a string, so the key comes
// from EP_COMM_SECRET (the secret itself, or "file:PATH" naming a file that
// holds it); without one the key is a public constant and the bootstrap is
// unauthenticated (it still tells jobs apart, but anyone who can reach the
// ports can join or stall them). The key is never logged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sha256.h"

namespace ep {

constexpr size_t kBootstrapKeyBytes = kSha256Bytes;

struct BootstrapKey {
  uint8_t bytes[kBootstrapKeyBytes] = {};
  bool authenticated = false;  // false: the public key of the unauthenticated EP_COMM_ID mode
};

// Fills buf with bytes from getrandom(), or /dev/urandom where that call is
// missing. False (with *error) when neither works: no key is ever made from
// guessable bytes.
bool osRandomBytes(void* buf, size_t len, std::string* error);

// A fresh random key (ids from epGetUniqueId).
bool randomBootstrapKey(BootstrapKey* key, std::string* error);

// The key of the EP_COMM_ID mode: derived from EP_COMM_SECRET when it is set,
// else the public key (key->authenticated false). False with *error when
// EP_COMM_SECRET is set but unusable (an unreadable or empty file, an empty
// secret): never a silent fall back to no authentication.
bool commSecretKey(BootstrapKey* key, std::string* error);

// Derives the key from secret bytes (exposed for the tests).
void deriveBootstrapKey(const void* secret, size_t len, BootstrapKey* key);

// The secret named by an EP_COMM_SECRET value: the value itself, or the
// contents of the file after "file:" without trailing line ends. False with
// *error when it cannot be read or is empty.
bool readCommSecret(const char* value, std::string* secret, std::string* error);

}  // namespace ep
