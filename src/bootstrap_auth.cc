#include "bootstrap_auth.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "debug.h"
#include "params.h"

namespace ep {

namespace {

constexpr char kFilePrefix[] = "file:";
// A secret file is a few bytes; anything much larger was named by mistake.
constexpr size_t kMaxSecretFileBytes = size_t(64) << 10;
// Shorter secrets are easy to guess; warned about, not refused.
constexpr size_t kShortSecretBytes = 16;

// Separates this use of the secret from any other the user may have for it.
constexpr char kKeyLabel[] = "moeep bootstrap key v1";

bool readUrandom(void* buf, size_t len, std::string* error) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = std::string("cannot open /dev/urandom: ") + strerror(errno);
    return false;
  }
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::read(fd, p + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = std::string("reading /dev/urandom failed: ") + (n < 0 ? strerror(errno) : "end of file");
      ::close(fd);
      return false;
    }
    got += size_t(n);
  }
  ::close(fd);
  return true;
}

bool readSecretFile(const char* path, std::string* secret, std::string* error) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = std::string("EP_COMM_SECRET names the file ") + path + ", which cannot be opened: " + strerror(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    EP_WARN(kSubsysBootstrap,
            "EP_COMM_SECRET file %s can be read or written by other users (mode %03o): chmod 600 it", path,
            unsigned(st.st_mode & 0777));
  std::vector<char> buf(kMaxSecretFileBytes + 1);
  size_t got = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = std::string("reading the EP_COMM_SECRET file ") + path + " failed: " + strerror(errno);
      ::close(fd);
      return false;
    }
    got += size_t(n);
    if (n == 0 || got == buf.size()) break;
  }
  ::close(fd);
  if (got > kMaxSecretFileBytes) {
    *error = std::string("the EP_COMM_SECRET file ") + path + " is larger than " +
             std::to_string(kMaxSecretFileBytes) + " bytes: is it the right file?";
    return false;
  }
  // A file written by `echo` ends in a line end that other tools may not add.
  while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) got--;
  secret->assign(buf.data(), got);
  secureZero(buf.data(), buf.size());
  if (secret->empty()) {
    *error = std::string("the EP_COMM_SECRET file ") + path + " is empty";
    return false;
  }
  return true;
}

}  // namespace

bool osRandomBytes(void* buf, size_t len, std::string* error) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    // Blocks only until the kernel's pool is first seeded (early boot).
    const ssize_t n = getrandom(p + got, len - got, 0);
    if (n > 0) {
      got += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ENOSYS) return readUrandom(p + got, len - got, error);
    *error = std::string("getrandom failed: ") + strerror(errno);
    return false;
  }
  return true;
}

void deriveBootstrapKey(const void* secret, size_t len, BootstrapKey* key) {
  HmacSha256 mac(secret, len);
  mac.update(kKeyLabel, sizeof(kKeyLabel) - 1);
  mac.finish(key->bytes);
}

bool randomBootstrapKey(BootstrapKey* key, std::string* error) {
  if (!osRandomBytes(key->bytes, sizeof(key->bytes), error)) return false;
  key->authenticated = true;
  return true;
}

bool readCommSecret(const char* value, std::string* secret, std::string* error) {
  if (strncmp(value, kFilePrefix, sizeof(kFilePrefix) - 1) == 0) {
    const char* path = value + sizeof(kFilePrefix) - 1;
    if (*path == '\0') {
      *error = "EP_COMM_SECRET=file: names no file";
      return false;
    }
    return readSecretFile(path, secret, error);
  }
  secret->assign(value);
  if (secret->empty()) {
    *error = "EP_COMM_SECRET is empty";
    return false;
  }
  return true;
}

bool commSecretKey(BootstrapKey* key, std::string* error) {
  const char* value = param::COMM_SECRET();
  if (value == nullptr || *value == '\0') {
    // The public key: jobs are told apart by their id, but not authenticated.
    deriveBootstrapKey("", 0, key);
    key->authenticated = false;
    return true;
  }
  std::string secret;
  if (!readCommSecret(value, &secret, error)) return false;
  if (secret.size() < kShortSecretBytes)
    EP_WARN(kSubsysBootstrap, "EP_COMM_SECRET is only %zu bytes long: a secret of at least %zu random bytes is "
            "hard to guess", secret.size(), kShortSecretBytes);
  deriveBootstrapKey(secret.data(), secret.size(), key);
  secureZero(&secret[0], secret.size());
  key->authenticated = true;
  return true;
}

}  // namespace ep
