#include "transport.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>

#include "debug.h"
#include "params.h"

namespace ep {

namespace {

std::vector<const epTransport_v1_t*>& builtins() {
  static std::vector<const epTransport_v1_t*> list;
  return list;
}

std::vector<TransportEntry>& registry() {
  static std::vector<TransportEntry> list;
  return list;
}

std::atomic<int> g_open_net_comms{0};
// Set while the library unloads: the thread-locals may be gone by then, so a
// transport that logs from finalize must not reach the last-warning store.
std::atomic<bool> g_unloading{false};

// Calls each available version-2 transport's finalize once, when the library
// is unloaded (the process exits, or the last dlclose). Made inside
// transportsInit after the registry, so destroyed before it. Skipped while a
// network communicator is open (a process that exits without destroying
// one, or with a thread still in a call): finalize may free what that
// communicator's context uses.
struct NetFinalizer {
  ~NetFinalizer() {
    if (g_open_net_comms.load() != 0) return;
    g_unloading = true;
    for (TransportEntry& e : registry())
      if (e.net != nullptr && e.available && e.net->finalize != nullptr) {
        e.net->finalize(e.ctx);
        e.available = false;
        e.ctx = nullptr;
      }
  }
};

// The last message (warning or info) a transport logged on this thread: the
// cause shown when its init fails.
thread_local std::string tls_last_transport_warning;

void transportLog(epTransportLogLevel_t level, const char* transport, const char* fmt, ...) {
  if (g_unloading.load(std::memory_order_relaxed)) return;  // finalize at exit: the log may be gone
  if (level != epTransportLogTrace) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tls_last_transport_warning = msg;
  }
  LogLevel lvl = level == epTransportLogWarn ? kLogWarn
                 : level == epTransportLogInfo ? kLogInfo
                                               : kLogTrace;
  if (!logEnabled(lvl, kSubsysTransport)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  logMessage(lvl, kSubsysTransport, __FILE__, __LINE__, "transport %s: %s", transport, msg);
}

const char* transportGetParam(const char* name) { return paramEnv(name); }

}  // namespace

void transportClearWarning() { tls_last_transport_warning.clear(); }
const std::string& transportLastWarning() { return tls_last_transport_warning; }

namespace {

const epTransportEnv_v1_t kEnv = {EP_TRANSPORT_ABI_VERSION, transportLog, transportGetParam};

// The names of EP_TRANSPORTS: "a,b" keeps only those, "^a,b" drops those, ""
// keeps all. Blanks around a name are not part of it ("cuda_ipc, shm" is
// read as a user means it); empty names are dropped.
std::vector<std::string> userTransportNames(bool* exclude) {
  const char* spec = param::TRANSPORTS();
  std::vector<std::string> names;
  if (spec == nullptr) spec = "";
  spec += strspn(spec, " \t");
  *exclude = spec[0] == '^';
  std::string s(spec + (*exclude ? 1 : 0));
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    const size_t first = s.find_first_not_of(" \t", pos);
    if (first != std::string::npos && first < comma) {
      const size_t last = s.find_last_not_of(" \t", comma - 1);
      names.push_back(s.substr(first, last + 1 - first));
    }
    pos = comma + 1;
  }
  return names;
}

// The built-in transports inside a node. A list that names neither chooses
// the network only (EP_TRANSPORTS=socket: TCP between nodes), and keeps them:
// without shm no host-backend communicator could form at all.
bool intraNode(const std::string& name) { return name == "shm" || name == "cuda_ipc"; }

bool allowedByUser(const char* name) {
  bool exclude = false;
  const std::vector<std::string> names = userTransportNames(&exclude);
  if (names.empty()) return true;  // unset, or only blanks and commas
  const bool listed = std::find(names.begin(), names.end(), name) != names.end();
  if (exclude) return !listed;
  return listed || (intraNode(name) && std::none_of(names.begin(), names.end(), intraNode));
}

// A name in EP_TRANSPORTS that no transport has is most likely a typo, which
// would otherwise disable (or fail to exclude) a transport without a word.
void warnUnknownUserTransports() {
  bool exclude = false;
  for (const std::string& n : userTransportNames(&exclude)) {
    bool known = false;
    for (const TransportEntry& e : registry())
      if (n == e.name) known = true;
    if (!known)
      EP_WARN(kSubsysTransport, "EP_TRANSPORTS=\"%s\": no transport is called \"%s\" (ignored)",
              param::TRANSPORTS(), n.c_str());
  }
}

// The callbacks the core calls without looking: a table that lacks one is
// refused here rather than crash the process at its first use. post and test
// (RDMA-like transports only), properties and finalize (not called yet) may
// be NULL, as modules built for this ABI version could leave them.
const char* missingCallback(const epTransport_v1_t* t) {
  const struct {
    const char* name;
    bool present;
  } callbacks[] = {
      {"init", t->init != nullptr},
      {"can_connect", t->can_connect != nullptr},
      {"reg_mem", t->reg_mem != nullptr},
      {"dereg_mem", t->dereg_mem != nullptr},
      {"connect", t->connect != nullptr},
      {"connected", t->connected != nullptr},
      {"close", t->close != nullptr},
  };
  for (const auto& c : callbacks)
    if (!c.present) return c.name;
  return nullptr;
}

// The same for a version-2 table (network transports): what the core calls
// without looking. properties, can_connect, conn_info and finalize may be NULL.
const char* missingCallbackV2(const epTransport_v2_t* t) {
  const struct {
    const char* name;
    bool present;
  } callbacks[] = {
      {"init", t->init != nullptr},           {"comm_open", t->comm_open != nullptr},
      {"endpoint", t->endpoint != nullptr},   {"connect", t->connect != nullptr},
      {"reg_mem", t->reg_mem != nullptr},     {"mem_handle", t->mem_handle != nullptr},
      {"dereg_mem", t->dereg_mem != nullptr}, {"put", t->put != nullptr},
      {"test", t->test != nullptr},           {"progress", t->progress != nullptr},
      {"last_error", t->last_error != nullptr}, {"close", t->close != nullptr},
      {"comm_close", t->comm_close != nullptr},
  };
  for (const auto& c : callbacks)
    if (!c.present) return c.name;
  return nullptr;
}

bool alreadyLoaded(const char* name, const std::string& origin) {
  for (const TransportEntry& e : registry())
    if (strcmp(e.name, name) == 0) {
      EP_INFO(kSubsysTransport, "transport %s from %s ignored: %s already loaded from %s", name,
              origin.c_str(), name, e.origin.c_str());
      return true;
    }
  return false;
}

void pushEntry(const TransportEntry& e) {
  EP_INFO(kSubsysTransport, "transport %s (%s, ABI v%u): %s", e.name, e.origin.c_str(), e.version,
          e.available ? "available" : e.reason.c_str());
  registry().push_back(e);
}

// Callers check that table->name is a non-empty string.
void addEntry(const epTransport_v1_t* table, const std::string& origin) {
  if (alreadyLoaded(table->name, origin)) return;
  TransportEntry e;
  e.name = table->name;
  e.version = 1;
  e.table = table;
  e.origin = origin;
  const char* missing = nullptr;
  if (!allowedByUser(table->name)) {
    e.reason = "disabled by EP_TRANSPORTS";
  } else if (table->version > EP_TRANSPORT_ABI_VERSION) {
    e.reason = "built for transport ABI v" + std::to_string(table->version) +
               ", newer than this library's v" + std::to_string(EP_TRANSPORT_ABI_VERSION);
  } else if (table->version != 1) {
    e.reason = "refused: its epTransport_v1 table says version " + std::to_string(table->version) +
               " (a version-" + std::to_string(table->version) + " table comes as epTransport_v" +
               std::to_string(table->version) + ")";
  } else if ((missing = missingCallback(table)) != nullptr) {
    e.reason = std::string("refused: its table has no ") + missing + " callback (mandatory)";
  } else {
    tls_last_transport_warning.clear();
    epResult_t res = table->init(&kEnv, &e.ctx);
    if (res == epSuccess) {
      e.available = true;
    } else {
      e.reason = std::string("init failed: ") + epGetErrorString(res);
      if (!tls_last_transport_warning.empty()) e.reason += " (" + tls_last_transport_warning + ")";
    }
  }
  pushEntry(e);
}

// A network table: version 2 (symbol epTransport_v2), or version 3
// (epTransport_v3: version 2's fields, then wait). Its version field must say
// the symbol's version: a later table version comes under a symbol of its own.
// The core calls version 2's fields through net (for version 3, a copy of
// them) and wait through the entry.
void addEntryNet(const epTransport_v2_t* table, unsigned version, const epTransport_v3_t* v3,
                 const std::string& origin) {
  if (alreadyLoaded(table->name, origin)) return;
  TransportEntry e;
  e.name = table->name;
  e.version = version;
  e.net = table;
  e.wait = v3 ? v3->wait : nullptr;
  e.drop_peer = v3 ? v3->drop_peer : nullptr;
  e.origin = origin;
  const char* missing = nullptr;
  if (!allowedByUser(table->name)) {
    e.reason = "disabled by EP_TRANSPORTS";
  } else if (table->version != version) {
    e.reason = "refused: its epTransport_v" + std::to_string(version) + " table says version " +
               std::to_string(table->version) + ", not " + std::to_string(version);
  } else if ((missing = missingCallbackV2(table)) != nullptr) {
    e.reason = std::string("refused: its table has no ") + missing + " callback (mandatory)";
  } else {
    tls_last_transport_warning.clear();
    epResult_t res = table->init(&kEnv, &e.ctx);
    if (res == epSuccess) {
      e.available = true;
    } else {
      e.reason = std::string("init failed: ") + epGetErrorString(res);
      if (!tls_last_transport_warning.empty()) e.reason += " (" + tls_last_transport_warning + ")";
    }
  }
  pushEntry(e);
}

// Version 3 is version 2's table, field for field, then wait.
#define EP_SAME_FIELD(f) static_assert(offsetof(epTransport_v3_t, f) == offsetof(epTransport_v2_t, f), #f)
EP_SAME_FIELD(name);
EP_SAME_FIELD(version);
EP_SAME_FIELD(init);
EP_SAME_FIELD(comm_open);
EP_SAME_FIELD(put);
EP_SAME_FIELD(progress);
EP_SAME_FIELD(finalize);
#undef EP_SAME_FIELD
static_assert(offsetof(epTransport_v3_t, wait) == sizeof(epTransport_v2_t), "wait follows version 2's fields");
static_assert(offsetof(epTransport_v3_t, drop_peer) == sizeof(epTransport_v2_t) + sizeof(void*), "then drop_peer");

// Version 2's fields of a version-3 table, as a version-2 table the entry
// points to for the life of the process.
const epTransport_v2_t* v2View(const epTransport_v3_t* t) {
  // Never destroyed: the finalizer calls through these views at exit, after
  // statics made later than it (this one) would be gone.
  static auto* views = new std::deque<epTransport_v2_t>;
  epTransport_v2_t v{};
  v.name = t->name;
  v.version = t->version;
  v.init = t->init;
  v.properties = t->properties;
  v.can_connect = t->can_connect;
  v.comm_open = t->comm_open;
  v.endpoint = t->endpoint;
  v.connect = t->connect;
  v.reg_mem = t->reg_mem;
  v.mem_handle = t->mem_handle;
  v.dereg_mem = t->dereg_mem;
  v.put = t->put;
  v.test = t->test;
  v.progress = t->progress;
  v.conn_info = t->conn_info;
  v.last_error = t->last_error;
  v.close = t->close;
  v.comm_close = t->comm_close;
  v.finalize = t->finalize;
  views->push_back(v);
  return &views->back();
}

// A module refused before its table could be read (no name, or a symbol that
// is not a table) is listed under the NAME of its file
// (libmoeep-transport-NAME.so), so that moeep_info shows why; the table
// listed is a stand-in that only carries that name and is never called.
void addRefused(const std::string& file_name, const std::string& origin, const std::string& reason) {
  struct StandIn {
    std::string name;
    epTransport_v1_t table;
  };
  static std::deque<StandIn> stand_ins;  // entries point into it for the life of the process
  std::string name = file_name.size() > 3 ? file_name.substr(0, file_name.size() - 3) : file_name;
  if (alreadyLoaded(name.c_str(), origin)) return;
  stand_ins.push_back(StandIn{name, epTransport_v1_t{}});
  StandIn& s = stand_ins.back();
  s.table.name = s.name.c_str();
  TransportEntry e;
  e.name = s.table.name;
  e.table = &s.table;
  e.origin = origin;
  e.reason = "refused: " + reason;
  EP_WARN(kSubsysTransport, "transport module %s: %s: refused", origin.c_str(), reason.c_str());
  pushEntry(e);
}

// Why the symbol epTransport_v1 at sym cannot be read as a table (a function,
// or an object smaller than the version-1 table), or "" when it can, or the
// dynamic linker cannot tell.
std::string notATable(void* sym, const char* symbol = "epTransport_v1",
                      size_t table_bytes = sizeof(epTransport_v1_t)) {
  Dl_info info;
  void* extra = nullptr;
  if (dladdr1(sym, &info, &extra, RTLD_DL_SYMENT) == 0 || extra == nullptr) return "";
  const auto* entry = static_cast<const ElfW(Sym)*>(extra);
  const unsigned type = ELF64_ST_TYPE(entry->st_info);
  if (type == STT_FUNC || type == STT_GNU_IFUNC)
    return std::string("its ") + symbol + " is a function, not a transport table";
  if (entry->st_size != 0 && entry->st_size < table_bytes)
    return std::string("its ") + symbol + " is " + std::to_string(entry->st_size) +
           " bytes, not a transport table (" + std::to_string(table_bytes) + " bytes)";
  return "";
}

// Directory of libmoeep.so itself, where modules are looked for first.
std::string libraryDir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&transportsInit), &info) == 0 || info.dli_fname == nullptr)
    return "";
  std::string path(info.dli_fname);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

void loadModulesFrom(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const char* prefix = "libmoeep-transport-";
  while (struct dirent* ent = readdir(d)) {
    const char* n = ent->d_name;
    size_t len = strlen(n);
    if (strncmp(n, prefix, strlen(prefix)) != 0 || len < 4 || strcmp(n + len - 3, ".so") != 0)
      continue;
    std::string path = dir + "/" + n;
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      EP_WARN(kSubsysTransport, "transport module %s not loaded: %s", path.c_str(), dlerror());
      continue;
    }
    // The newest table the module offers that this core knows: v3, v2, else
    // v1. A version-3 table that cannot be taken leaves the module's version
    // 2 to be tried (it still loads, without wait).
    std::string v3_problem;
    if (void* sym3 = dlsym(lib, "epTransport_v3")) {
      v3_problem = notATable(sym3, "epTransport_v3", sizeof(epTransport_v3_t));
      const auto* table3 = static_cast<const epTransport_v3_t*>(sym3);
      if (v3_problem.empty() && (table3->name == nullptr || table3->name[0] == '\0'))
        v3_problem = "its epTransport_v3 table has no name";
      else if (v3_problem.empty() && table3->version != 3)
        v3_problem = "its epTransport_v3 table says version " + std::to_string(table3->version) + ", not 3";
      if (v3_problem.empty()) {
        addEntryNet(v2View(table3), 3, table3, path);
        continue;
      }
      EP_WARN(kSubsysTransport, "transport module %s: %s: its epTransport_v2, if any, is taken instead",
              path.c_str(), v3_problem.c_str());
    }
    if (void* sym2 = dlsym(lib, "epTransport_v2")) {
      const std::string bad = notATable(sym2, "epTransport_v2", sizeof(epTransport_v2_t));
      const auto* table2 = static_cast<const epTransport_v2_t*>(sym2);
      if (!bad.empty())
        addRefused(n + strlen(prefix), path, bad);
      else if (table2->name == nullptr || table2->name[0] == '\0')
        addRefused(n + strlen(prefix), path, "its table has no name");
      else
        addEntryNet(table2, 2, nullptr, path);
      continue;
    }
    if (!v3_problem.empty()) {
      addRefused(n + strlen(prefix), path, v3_problem);
      continue;
    }
    void* sym = dlsym(lib, "epTransport_v1");
    auto* table = static_cast<const epTransport_v1_t*>(sym);
    if (table == nullptr) {
      EP_WARN(kSubsysTransport, "transport module %s has no epTransport_v3, epTransport_v2 or epTransport_v1 symbol: ignored",
              path.c_str());
      dlclose(lib);
      continue;
    }
    // Not a table: reading its name would read code or past the object.
    const std::string bad = notATable(sym);
    if (!bad.empty()) {
      addRefused(n + strlen(prefix), path, bad);
      continue;
    }
    // modules stay loaded for the life of the process
    if (table->name == nullptr || table->name[0] == '\0')
      addRefused(n + strlen(prefix), path, "its table has no name");
    else
      addEntry(table, path);
  }
  closedir(d);
}

}  // namespace

void transportRegisterBuiltin(const epTransport_v1_t* table) { builtins().push_back(table); }

void transportsInit() {
  static std::once_flag once;
  std::call_once(once, [] {
    registry();  // before the finalizer: destroyed after it
    static NetFinalizer finalizer;
    (void)finalizer;
    for (const epTransport_v1_t* t : builtins()) addEntry(t, "built-in");
    std::string dirs = libraryDir();
    const char* extra = param::TRANSPORT_PATH();
    if (extra && *extra) dirs = std::string(extra) + ":" + dirs;
    size_t pos = 0;
    while (pos <= dirs.size()) {
      size_t colon = dirs.find(':', pos);
      if (colon == std::string::npos) colon = dirs.size();
      if (colon > pos) loadModulesFrom(dirs.substr(pos, colon - pos));
      pos = colon + 1;
    }
    warnUnknownUserTransports();
  });
}

const std::vector<TransportEntry>& transportList() {
  transportsInit();
  return registry();
}

void transportCommOpened() { g_open_net_comms++; }
void transportCommClosed() { g_open_net_comms--; }

bool transportNamedByUser(const char* name) {
  bool exclude = false;
  const std::vector<std::string> names = userTransportNames(&exclude);
  return !exclude && std::find(names.begin(), names.end(), name) != names.end();
}

const TransportEntry* transportFind(const char* name, std::string* reason) {
  for (const TransportEntry& e : transportList()) {
    if (strcmp(e.name, name) != 0) continue;
    if (e.available) return &e;
    if (reason) *reason = e.reason;
    return nullptr;
  }
  if (reason) *reason = "not built in and no module found";
  return nullptr;
}

}  // namespace ep
