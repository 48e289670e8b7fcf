// The transport loader: built-in transports, libmoeep-transport-NAME.so
// modules found on EP_TRANSPORT_PATH, EP_TRANSPORTS selection, modules of a
// newer ABI refused with a reason, a module without the symbol ignored, tables
// without a name or a mandatory callback refused with a reason.
//
// The registry is built once per process, so each case runs in a forked child
// with its own environment and reports through its exit status.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "common.h"

#include "moeep.h"
#include "transport.h"

namespace {

std::string g_modules;  // build/tests/modules, next to this program

struct Found {
  bool present = false;
  int available = 0;
  std::string detail;
};

Found find(const char* name) {
  Found f;
  for (int i = 0;; i++) {
    const char* n = nullptr;
    const char* detail = nullptr;
    int available = 0;
    if (epGetTransport(i, &n, &available, &detail) != epSuccess) break;
    if (strcmp(n, name) == 0) {
      f.present = true;
      f.available = available;
      f.detail = detail ? detail : "";
    }
  }
  return f;
}

// Runs body in a child with EP_TRANSPORT_PATH / EP_TRANSPORTS set; body
// returns an empty string on success or what went wrong.
void inChild(const char* transports, const std::function<std::string()>& body) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("EP_TRANSPORT_PATH", g_modules.c_str(), 1);
    if (transports) setenv("EP_TRANSPORTS", transports, 1);
    else unsetenv("EP_TRANSPORTS");
    std::string why = body();
    if (!why.empty()) fprintf(stderr, "  child: %s\n", why.c_str());
    _exit(why.empty() ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

void module_on_path_is_loaded(void**) {
  inChild(nullptr, [] {
    Found f = find("fake");
    if (!f.present) return std::string("module 'fake' not listed");
    if (!f.available) return "module 'fake' unavailable: " + f.detail;
    if (f.detail.find("libmoeep-transport-fake.so") == std::string::npos) return "origin is '" + f.detail + "'";
    if (!find("shm").available) return std::string("built-in shm missing next to modules");
    return std::string();
  });
}

void newer_abi_module_is_refused_with_reason(void**) {
  inChild(nullptr, [] {
    Found f = find("future");
    if (!f.present) return std::string("module 'future' not listed");
    if (f.available) return std::string("module of ABI v99 accepted");
    if (f.detail.find("newer") == std::string::npos || f.detail.find("v99") == std::string::npos)
      return "reason '" + f.detail + "' does not name the newer ABI";
    return std::string();
  });
}

void module_without_symbol_is_ignored(void**) {
  inChild(nullptr, [] {
    if (find("nosym").present) return std::string("a module without epTransport_v1 was listed");
    // ... and the library still works.
    epConfig_t cfg = EP_CONFIG_INITIALIZER;
    cfg.num_experts = 2;
    cfg.hidden = 8;
    cfg.max_tokens_per_rank = 1;
    cfg.max_topk = 1;
    cfg.backend = epBackendHost;
    epComm_t comm = nullptr;
    if (epCommInitAll(&comm, 1, nullptr, &cfg) != epSuccess) return std::string(epGetLastError(nullptr));
    epCommDestroy(comm);
    return std::string();
  });
}

void nameless_table_is_refused_under_its_file_name(void**) {
  inChild(nullptr, [] {
    Found f = find("noname");
    if (!f.present) return std::string("module with a NULL name not listed as 'noname'");
    if (f.available) return std::string("module with a NULL name accepted");
    if (f.detail.find("no name") == std::string::npos) return "reason '" + f.detail + "'";
    std::string reason;
    if (ep::transportFind("noname", &reason) != nullptr || reason != f.detail)
      return "transportFind: '" + reason + "'";
    if (!find("fake").available) return std::string("'fake' unavailable next to 'noname'");
    return std::string();
  });
}

void table_without_mandatory_callback_is_refused(void**) {
  inChild(nullptr, [] {
    Found f = find("noconnect");
    if (!f.present) return std::string("module 'noconnect' not listed");
    if (f.available) return std::string("module without connect accepted");
    if (f.detail.find("connect callback") == std::string::npos) return "reason '" + f.detail + "'";
    // properties and finalize are not called by the core: a table may leave them out.
    Found o = find("noprops");
    if (!o.present || !o.available) return "module without properties / finalize refused: '" + o.detail + "'";
    return std::string();
  });
}

// A module whose epTransport_v1 is a function (or any symbol too small to be a
// table) is refused with a reason instead of read as a table.
void symbol_that_is_not_a_table_is_refused(void**) {
  inChild(nullptr, [] {
    Found f = find("funcsym");
    if (f.available) return std::string("module whose epTransport_v1 is a function accepted");
    if (!f.present) return std::string("module 'funcsym' not listed with a reason");
    if (f.detail.find("not a transport table") == std::string::npos) return "reason '" + f.detail + "'";
    if (!find("fake").available) return std::string("'fake' unavailable next to 'funcsym'");
    return std::string();
  });
}

// Network tables come under a symbol per version: a valid version-2 one is
// available as ABI v2 (no wait), one without put is refused naming it, a
// module that exports v1 and v2 is taken at v2, one that exports v2 and v3
// at v3, with its wait, and one whose v3 table is wrong at its v2.
void version_2_tables_are_loaded_and_checked(void**) {
  inChild(nullptr, [] {
    Found f = find("fakenet");
    if (!f.present || !f.available) return "version-2 module 'fakenet' not available: '" + f.detail + "'";
    const ep::TransportEntry* e = ep::transportFind("fakenet");
    if (e == nullptr || e->version != 2 || e->net == nullptr || e->table != nullptr)
      return std::string("'fakenet' not entered as a version-2 table");
    Found n = find("noput");
    if (!n.present || n.available) return std::string("version-2 module without put accepted or not listed");
    if (n.detail.find("no put callback") == std::string::npos) return "reason '" + n.detail + "'";
    const ep::TransportEntry* b = ep::transportFind("both");
    if (b == nullptr || b->version != 2 || b->net == nullptr)
      return std::string("a module with both tables was not taken at version 2");
    if (e->wait != nullptr || b->wait != nullptr) return std::string("a version-2 table given a wait");
    const ep::TransportEntry* w = ep::transportFind("waits");
    if (w == nullptr || w->version != 3 || w->net == nullptr || w->wait == nullptr || w->drop_peer == nullptr)
      return std::string("a module with tables v2 and v3 was not taken at version 3 with its wait");
    if (w->net->put == nullptr || w->net->finalize == nullptr || strcmp(w->net->name, "waits") != 0)
      return std::string("version 3's fields were not carried into the entry's version-2 view");
    const ep::TransportEntry* b3 = ep::transportFind("badthree");
    if (b3 == nullptr || b3->version != 2 || b3->wait != nullptr)
      return std::string("a module whose v3 table says version 7 was not taken at its version 2");
    return std::string();
  });
}

void ep_transports_list_selects(void**) {
  inChild("shm", [] {
    Found f = find("fake");
    if (!f.present || f.available) return std::string("'fake' should be listed but disabled");
    if (f.detail.find("EP_TRANSPORTS") == std::string::npos) return "reason '" + f.detail + "'";
    if (!find("shm").available) return std::string("shm disabled though selected");
    return std::string();
  });
}

std::string logged(const char* path);

// A version-2 transport's finalize is called once as the process exits (the
// library's static destruction), for each available module: the fake ones
// write their names into FAKE_FINALIZE_FILE.
void version_2_finalize_is_called_at_exit(void**) {
  char path[] = "/tmp/test_finalize_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("EP_TRANSPORT_PATH", g_modules.c_str(), 1);
    unsetenv("EP_TRANSPORTS");
    setenv("FAKE_FINALIZE_FILE", path, 1);
    const bool loaded = find("fakenet").available && find("both").available && find("waits").available &&
                        find("badthree").available;
    exit(loaded ? 0 : 3);  // exit, not _exit: static destructors run
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  const std::string text = logged(path);
  unlink(path);
  if (text.size() != strlen("finalize fakenet\nfinalize both\nfinalize waits\nfinalize badthree\n") ||
      text.find("finalize fakenet\n") == std::string::npos || text.find("finalize both\n") == std::string::npos ||
      text.find("finalize waits\n") == std::string::npos || text.find("finalize badthree\n") == std::string::npos)
    fail_msg("finalize calls: '%s'", text.c_str());
}

// A list of network transports only chooses the network and keeps the
// intra-node built-ins (EP_TRANSPORTS=socket: TCP between nodes, shm inside).
void ep_transports_of_the_network_only_keep_shm(void**) {
  inChild("fakenet", [] {
    if (!find("fakenet").available) return "'fakenet' disabled though selected: " + find("fakenet").detail;
    if (!find("shm").available) return "shm disabled by a list of network transports: " + find("shm").detail;
    if (find("fake").available) return std::string("'fake' available though not listed");
    return std::string();
  });
}

// What the library logged to EP_DEBUG_FILE path (set before its first call).
std::string logged(const char* path) {
  std::string text;
  if (FILE* f = fopen(path, "r")) {
    char buf[512];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    fclose(f);
  }
  return text;
}

void ep_transports_names_are_trimmed_and_unknown_ones_warned(void**) {
  char log[] = "/tmp/test_transport_XXXXXX";
  int fd = mkstemp(log);
  assert_true(fd >= 0);
  close(fd);
  inChild(" shm , fake,  nosuch ,", [&log] {
    setenv("EP_DEBUG", "WARN", 1);
    setenv("EP_DEBUG_FILE", log, 1);
    if (!find("shm").available) return "shm disabled by ' shm '; " + find("shm").detail;
    if (!find("fake").available) return "'fake' disabled by ' fake'; " + find("fake").detail;
    if (find("future").available) return std::string("'future' available though not listed");
    const std::string text = logged(log);
    if (text.find("no transport is called \"nosuch\"") == std::string::npos)
      return "no warning about 'nosuch' in: " + text;
    if (text.find("called \"shm\"") != std::string::npos || text.find("called \"\"") != std::string::npos)
      return "a known or empty name warned about: " + text;
    return std::string();
  });
  unlink(log);
  inChild(" ^ shm", [] {
    if (find("shm").available) return std::string("shm available though excluded by ' ^ shm'");
    if (!find("fake").available) return std::string("'fake' disabled though not excluded");
    return std::string();
  });
}

void ep_transports_exclusion(void**) {
  inChild("^fake,future", [] {
    if (find("fake").available) return std::string("'fake' available though excluded");
    if (!find("shm").available) return std::string("shm disabled though not excluded");
    return std::string();
  });
}

void excluding_shm_fails_host_init_with_reason(void**) {
  inChild("^shm", [] {
    epConfig_t cfg = EP_CONFIG_INITIALIZER;
    cfg.num_experts = 2;
    cfg.hidden = 8;
    cfg.max_tokens_per_rank = 1;
    cfg.max_topk = 1;
    cfg.backend = epBackendHost;
    epComm_t comm = nullptr;
    epResult_t res = epCommInitAll(&comm, 1, nullptr, &cfg);
    if (res == epSuccess) return std::string("host init succeeded without shm");
    if (strstr(epGetLastError(nullptr), "shm") == nullptr)
      return std::string("message does not name shm: ") + epGetLastError(nullptr);
    return std::string();
  });
}

}  // namespace

int main(int, char** argv) {
  std::string self = argv[0];
  g_modules = self.substr(0, self.rfind('/') + 1) + "modules";
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(module_on_path_is_loaded),
      cmocka_unit_test(newer_abi_module_is_refused_with_reason),
      cmocka_unit_test(module_without_symbol_is_ignored),
      cmocka_unit_test(nameless_table_is_refused_under_its_file_name),
      cmocka_unit_test(table_without_mandatory_callback_is_refused),
      cmocka_unit_test(symbol_that_is_not_a_table_is_refused),
      cmocka_unit_test(version_2_tables_are_loaded_and_checked),
      cmocka_unit_test(ep_transports_list_selects),
      cmocka_unit_test(ep_transports_of_the_network_only_keep_shm),
      cmocka_unit_test(version_2_finalize_is_called_at_exit),
      cmocka_unit_test(ep_transports_exclusion),
      cmocka_unit_test(ep_transports_names_are_trimmed_and_unknown_ones_warned),
      cmocka_unit_test(excluding_shm_fails_host_init_with_reason),
  };
  return cmocka_run_group_tests_name("transport loader", tests, nullptr, nullptr);
}
