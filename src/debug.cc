#include "debug.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "params.h"

namespace ep {

namespace {

struct LogState {
  LogLevel level = kLogNone;
  unsigned subsys = kSubsysAll;
  FILE* out = stderr;
  char host[64] = "";
};

std::atomic<CommErrorStore> comm_error_store{nullptr};
thread_local int tls_device = -1;
thread_local char tls_last_error[1024] = "";

const struct {
  const char* name;
  unsigned bit;
} kSubsysNames[] = {{"INIT", kSubsysInit},           {"BOOTSTRAP", kSubsysBootstrap},
                    {"TOPO", kSubsysTopo},           {"TRANSPORT", kSubsysTransport},
                    {"DISPATCH", kSubsysDispatch},   {"COMBINE", kSubsysCombine},
                    {"PARAMS", kSubsysParams},       {"CUDA", kSubsysCuda},
                    {"ALL", kSubsysAll}};

// Unknown names are said on stderr (the log itself is being set up) and
// ignored; a list of unknown names only logs every subsystem rather than none.
unsigned parseSubsys(const char* text) {
  bool invert = text[0] == '^';
  if (invert) text++;
  unsigned mask = 0;
  bool known = false;
  std::string s(text);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    std::string item = s.substr(pos, comma - pos);
    bool found = item.empty();
    for (auto& n : kSubsysNames)
      if (strcasecmp(item.c_str(), n.name) == 0) {
        mask |= n.bit;
        found = known = true;
      }
    if (!found) {
      std::string names;
      for (auto& n : kSubsysNames) names += std::string(names.empty() ? "" : ", ") + n.name;
      fprintf(stderr, "EP WARN EP_DEBUG_SUBSYS: unknown subsystem \"%s\" ignored (known: %s)\n", item.c_str(),
              names.c_str());
    }
    pos = comma + 1;
  }
  if (!known && !invert) return kSubsysAll;
  return invert ? ~mask : mask;
}

LogState& state() {
  static LogState st;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* lvl = param::DEBUG();
    if (strcasecmp(lvl, "WARN") == 0) st.level = kLogWarn;
    else if (strcasecmp(lvl, "INFO") == 0) st.level = kLogInfo;
    else if (strcasecmp(lvl, "TRACE") == 0) st.level = kLogTrace;
    else if (*lvl != '\0')
      fprintf(stderr, "EP WARN EP_DEBUG=\"%s\" is not WARN, INFO or TRACE: logging stays off\n", lvl);
    st.subsys = parseSubsys(param::DEBUG_SUBSYS());
    gethostname(st.host, sizeof(st.host) - 1);
    char* dot = strchr(st.host, '.');
    if (dot) *dot = '\0';
    const char* file = param::DEBUG_FILE();
    if (*file != '\0') {
      std::string path;
      for (const char* c = file; *c; c++) {
        if (c[0] == '%' && c[1] == 'h') { path += st.host; c++; }
        else if (c[0] == '%' && c[1] == 'p') { path += std::to_string(getpid()); c++; }
        else path += *c;
      }
      FILE* f = fopen(path.c_str(), "w");
      if (f != nullptr) { setvbuf(f, nullptr, _IOLBF, 0); st.out = f; }
    }
  });
  return st;
}

}  // namespace

bool logEnabled(LogLevel level, unsigned subsys) {
  const LogState& st = state();
  return level <= st.level && (subsys & st.subsys) != 0;
}

void logSetDevice(int device) { tls_device = device; }

void logMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(level, subsys)) return;
  LogState& st = state();
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* lvl = level == kLogWarn ? "WARN" : level == kLogInfo ? "INFO" : "TRACE";
  long tid = syscall(SYS_gettid);
  if (level == kLogTrace)
    fprintf(st.out, "%s:%d:%ld [%d] EP %s %s:%d %s\n", st.host, getpid(), tid, tls_device, lvl,
            file, line, msg);
  else
    fprintf(st.out, "%s:%d:%ld [%d] EP %s %s\n", st.host, getpid(), tid, tls_device, lvl, msg);
}

epResult_t vsetError(epComm* comm, epResult_t res, const char* fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  snprintf(tls_last_error, sizeof(tls_last_error), "%s", msg);
  const CommErrorStore store = comm_error_store.load(std::memory_order_acquire);
  if (comm != nullptr && store != nullptr) store(comm, msg);
  logMessage(kLogWarn, kSubsysAll, "", 0, "%s: %s", epGetErrorString(res), msg);
  return res;
}

epResult_t setError(epComm* comm, epResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsetError(comm, res, fmt, ap);
  va_end(ap);
  return res;
}

void setCommErrorStore(CommErrorStore store) { comm_error_store.store(store, std::memory_order_release); }

void clearThreadError() { tls_last_error[0] = '\0'; }
const char* threadLastError() { return tls_last_error; }

}  // namespace ep
