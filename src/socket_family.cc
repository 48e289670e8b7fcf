// EP_SOCKET_FAMILY read for the bootstrap. Kept apart from socket.cc, which
// holds no library state (no parameters, no log) so that a transport module
// can compile it in as well.
#include <strings.h>
#include <sys/socket.h>

#include <cstring>
#include <mutex>

#include "debug.h"
#include "params.h"
#include "socket.h"

namespace ep {

int socketFamilyFromParam() {
  const char* text = param::SOCKET_FAMILY();
  if (text == nullptr || *text == '\0') return AF_UNSPEC;
  if (strcasecmp(text, "AF_INET") == 0 || strcasecmp(text, "INET") == 0 ||
      strcasecmp(text, "IPV4") == 0 || strcmp(text, "4") == 0)
    return AF_INET;
  if (strcasecmp(text, "AF_INET6") == 0 || strcasecmp(text, "INET6") == 0 ||
      strcasecmp(text, "IPV6") == 0 || strcmp(text, "6") == 0)
    return AF_INET6;
  static std::once_flag warned;
  std::call_once(warned, [text] {
    EP_WARN(kSubsysBootstrap, "EP_SOCKET_FAMILY=\"%s\" is neither AF_INET nor AF_INET6, ignored", text);
  });
  return AF_UNSPEC;
}

}  // namespace ep
