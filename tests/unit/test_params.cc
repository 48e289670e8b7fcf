// The EP_* parameter table (src/params.def), its parser and accessors, and
// epGetParam.
//
// The group setup clears every EP_* variable the table knows and routes the
// log (EP_DEBUG=INFO, EP_DEBUG_SUBSYS=PARAMS) to a file of this process, so
// that the cases can check what the library logged. Each accessor caches its
// first read, so every accessor case uses a parameter that no other case (and
// nothing the library runs here) reads, and sets its variable first.
#include <unistd.h>

#include <set>
#include <string>

#include "common.h"
#include "params.h"

namespace {

std::string g_log_path;

std::string readLog() {
  std::string text;
  FILE* f = fopen(g_log_path.c_str(), "r");
  if (f == nullptr) return text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  fclose(f);
  return text;
}

int countOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    count++;
  return count;
}

const ep::ParamInfo* findParam(const char* name) {
  for (int i = 0; i < ep::paramCount(); i++)
    if (strcmp(ep::paramInfo(i).name, name) == 0) return &ep::paramInfo(i);
  return nullptr;
}

int groupSetup(void**) {
  eptest::unsetAllParams();
  char path[256];
  snprintf(path, sizeof(path), "/tmp/moeep_test_params.%d.log", int(getpid()));
  g_log_path = path;
  setenv("EP_DEBUG", "INFO", 1);
  setenv("EP_DEBUG_SUBSYS", "PARAMS", 1);
  setenv("EP_DEBUG_FILE", path, 1);
  setenv("EP_BOGUS_TEST_VARIABLE", "1", 1);
  return 0;
}

int groupTeardown(void**) {
  unlink(g_log_path.c_str());
  return 0;
}

// ---- The table ---------------------------------------------------------------

void table_is_not_empty_and_names_are_unique(void**) {
  assert_true(ep::paramCount() >= 10);
  std::set<std::string> names;
  for (int i = 0; i < ep::paramCount(); i++) {
    const char* name = ep::paramInfo(i).name;
    assert_non_null(name);
    bool inserted = names.insert(name).second;
    if (!inserted) print_error("duplicate parameter name %s\n", name);
    assert_true(inserted);
  }
  assert_int_equal(int(names.size()), ep::paramCount());
}

void table_names_are_upper_case_without_prefix(void**) {
  for (int i = 0; i < ep::paramCount(); i++) {
    const char* name = ep::paramInfo(i).name;
    assert_true(strlen(name) > 0);
    // The table holds the name without "EP_"; epGetParam adds it.
    assert_int_not_equal(strncmp(name, "EP_", 3), 0);
    for (const char* c = name; *c; c++) {
      bool ok = (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_';
      if (!ok) print_error("parameter %s has character '%c'\n", name, *c);
      assert_true(ok);
    }
  }
}

void table_entries_have_doc_kind_and_default(void**) {
  for (int i = 0; i < ep::paramCount(); i++) {
    const ep::ParamInfo& p = ep::paramInfo(i);
    assert_non_null(p.doc);
    if (strlen(p.doc) < 10) print_error("parameter %s has doc \"%s\"\n", p.name, p.doc);
    assert_true(strlen(p.doc) >= 10);
    assert_non_null(p.kind);
    bool is_int = strcmp(p.kind, "INT") == 0, is_str = strcmp(p.kind, "STR") == 0 || strcmp(p.kind, "SECRET") == 0;
    if (!is_int && !is_str) print_error("parameter %s has kind \"%s\"\n", p.name, p.kind);
    assert_true(is_int || is_str);
    assert_non_null(p.default_value);
    if (is_int) {
      int64_t v = -12345;
      bool parsed = ep::parseInt64(p.default_value, &v);
      if (!parsed) print_error("INT parameter %s has default \"%s\"\n", p.name, p.default_value);
      assert_true(parsed);
    }
  }
}

void table_has_the_documented_entries(void**) {
  const ep::ParamInfo* timeout = findParam("TIMEOUT_MS");
  assert_non_null(timeout);
  assert_string_equal(timeout->kind, "INT");
  assert_string_equal(timeout->default_value, "60000");
  const ep::ParamInfo* shm = findParam("SHM_DIR");
  assert_non_null(shm);
  assert_string_equal(shm->kind, "STR");
  assert_string_equal(shm->default_value, "/dev/shm");
  const ep::ParamInfo* subsys = findParam("DEBUG_SUBSYS");
  assert_non_null(subsys);
  assert_string_equal(subsys->default_value, "ALL");
  for (const char* name : {"DEBUG", "DEBUG_FILE", "COMM_ID", "NODE_SIZE", "HOST_ID", "NUM_SMS",
                           "BUFFER_BYTES_CAP", "HOST_CHUNK_TOKENS", "HOST_RING_SLOTS"}) {
    if (findParam(name) == nullptr) print_error("EP_%s missing from the table\n", name);
    assert_non_null(findParam(name));
  }
  assert_null(findParam("NO_SUCH_PARAMETER"));
}

// ---- parseInt64 --------------------------------------------------------------

void parse_int64_accepts_decimal(void**) {
  int64_t v = -1;
  assert_true(ep::parseInt64("0", &v));
  assert_int_equal(v, 0);
  assert_true(ep::parseInt64("42", &v));
  assert_int_equal(v, 42);
  assert_true(ep::parseInt64("60000", &v));
  assert_int_equal(v, 60000);
  assert_true(ep::parseInt64("+7", &v));
  assert_int_equal(v, 7);
  assert_true(ep::parseInt64("9223372036854775807", &v));
  assert_true(v == INT64_MAX);
}

void parse_int64_accepts_hex(void**) {
  int64_t v = -1;
  assert_true(ep::parseInt64("0x10", &v));
  assert_int_equal(v, 16);
  assert_true(ep::parseInt64("0X1f", &v));
  assert_int_equal(v, 31);
  assert_true(ep::parseInt64("0xffffffff", &v));
  assert_true(v == int64_t(0xffffffffll));
  assert_true(ep::parseInt64("0x7fffffffffffffff", &v));
  assert_true(v == INT64_MAX);
}

void parse_int64_accepts_negatives(void**) {
  int64_t v = 0;
  assert_true(ep::parseInt64("-1", &v));
  assert_true(v == -1);
  assert_true(ep::parseInt64("-0x10", &v));
  assert_true(v == -16);
  assert_true(ep::parseInt64("-9223372036854775808", &v));
  assert_true(v == INT64_MIN);
}

void parse_int64_rejects_garbage_and_keeps_value(void**) {
  const char* bad[] = {"", "abc", "12abc", "1.5", "0x", "--1", "1 2", "0xg", " ", "1e3", "12 x"};
  for (const char* text : bad) {
    int64_t v = 77;
    bool parsed = ep::parseInt64(text, &v);
    if (parsed) print_error("parseInt64(\"%s\") accepted it as %lld\n", text, (long long)v);
    assert_false(parsed);
    assert_int_equal(v, 77);
  }
  int64_t v = 77;
  assert_false(ep::parseInt64(nullptr, &v));
  assert_int_equal(v, 77);
}

void parse_int64_accepts_trailing_spaces_and_tabs(void**) {
  int64_t v = 0;
  assert_true(ep::parseInt64("42 ", &v));
  assert_int_equal(v, 42);
  assert_true(ep::parseInt64("43 \t  ", &v));
  assert_int_equal(v, 43);
  assert_true(ep::parseInt64("0x20\t", &v));
  assert_int_equal(v, 32);
  assert_false(ep::parseInt64("44 5", &v));
  assert_int_equal(v, 32);
}

void parse_int64_rejects_overflow(void**) {
  const char* bad[] = {"9223372036854775808", "-9223372036854775809", "0x8000000000000000",
                       "99999999999999999999", "-0x8000000000000001"};
  for (const char* text : bad) {
    int64_t v = 5;
    bool parsed = ep::parseInt64(text, &v);
    if (parsed) print_error("parseInt64(\"%s\") accepted it as %lld\n", text, (long long)v);
    assert_false(parsed);
    assert_int_equal(v, 5);
  }
}

// ---- epGetParam ----------------------------------------------------------------

void get_param_enumerates_every_entry_with_prefix(void**) {
  for (int i = 0; i < ep::paramCount(); i++) {
    const char *name = nullptr, *def = nullptr, *doc = nullptr;
    const char* value = "sentinel";
    assert_ok(epGetParam(i, &name, &def, &value, &doc));
    const ep::ParamInfo& p = ep::paramInfo(i);
    std::string expected = std::string("EP_") + p.name;
    assert_non_null(name);
    assert_string_equal(name, expected.c_str());
    assert_non_null(def);
    assert_string_equal(def, p.default_value);
    assert_non_null(doc);
    assert_string_equal(doc, p.doc);
    // Value agrees with the environment as it is now.
    const char* env = getenv(expected.c_str());
    if (env == nullptr || *env == '\0') assert_null(value);
    else assert_string_equal(value, env);
  }
}

void get_param_rejects_index_past_the_end_and_negative(void**) {
  const char* name = "untouched";
  assert_result(epGetParam(ep::paramCount(), &name, nullptr, nullptr, nullptr), epInvalidArgument);
  assert_string_equal(name, "untouched");
  assert_result(epGetParam(ep::paramCount() + 100, &name, nullptr, nullptr, nullptr),
                epInvalidArgument);
  assert_result(epGetParam(-1, &name, nullptr, nullptr, nullptr), epInvalidArgument);
  assert_string_equal(name, "untouched");
  // The loop a tool writes stops exactly at the table's end.
  int n = 0;
  while (epGetParam(n, nullptr, nullptr, nullptr, nullptr) == epSuccess) n++;
  assert_int_equal(n, ep::paramCount());
}

void get_param_value_follows_environment(void**) {
  int index = -1;
  for (int i = 0; i < ep::paramCount(); i++)
    if (strcmp(ep::paramInfo(i).name, "SOCKET_FAMILY") == 0) index = i;
  assert_true(index >= 0);
  const char* value = "sentinel";
  unsetenv("EP_SOCKET_FAMILY");
  assert_ok(epGetParam(index, nullptr, nullptr, &value, nullptr));
  assert_null(value);
  setenv("EP_SOCKET_FAMILY", "AF_INET6", 1);
  assert_ok(epGetParam(index, nullptr, nullptr, &value, nullptr));
  assert_non_null(value);
  assert_string_equal(value, "AF_INET6");
  setenv("EP_SOCKET_FAMILY", "", 1);  // empty counts as unset
  value = "sentinel";
  assert_ok(epGetParam(index, nullptr, nullptr, &value, nullptr));
  assert_null(value);
  unsetenv("EP_SOCKET_FAMILY");
}

void param_env_reads_fresh_and_treats_empty_as_unset(void**) {
  unsetenv("EP_HOST_ID");
  assert_null(ep::paramEnv("HOST_ID"));
  setenv("EP_HOST_ID", "node-a", 1);
  assert_non_null(ep::paramEnv("HOST_ID"));
  assert_string_equal(ep::paramEnv("HOST_ID"), "node-a");
  setenv("EP_HOST_ID", "node-b", 1);
  assert_string_equal(ep::paramEnv("HOST_ID"), "node-b");
  setenv("EP_HOST_ID", "", 1);
  assert_null(ep::paramEnv("HOST_ID"));
  unsetenv("EP_HOST_ID");
  assert_null(ep::paramEnv("HOST_ID"));
}

// ---- Cached accessors --------------------------------------------------------------

void int_accessor_reads_hex_once_and_logs_it(void**) {
  setenv("EP_HOST_CHUNK_TOKENS", "0x20", 1);
  assert_int_equal(ep::param::HOST_CHUNK_TOKENS(), 32);
  setenv("EP_HOST_CHUNK_TOKENS", "64", 1);  // cached: a later change is not seen
  assert_int_equal(ep::param::HOST_CHUNK_TOKENS(), 32);
  unsetenv("EP_HOST_CHUNK_TOKENS");
  assert_contains(readLog().c_str(), "EP_HOST_CHUNK_TOKENS set by environment to 32");
}

void int_accessor_with_trailing_space(void**) {
  setenv("EP_NUM_SMS", "12  ", 1);
  assert_int_equal(ep::param::NUM_SMS(), 12);
  unsetenv("EP_NUM_SMS");
}

void int_accessor_malformed_warns_and_keeps_default(void**) {
  setenv("EP_HOST_RING_SLOTS", "four", 1);
  assert_int_equal(ep::param::HOST_RING_SLOTS(), 4);
  unsetenv("EP_HOST_RING_SLOTS");
  std::string log = readLog();
  assert_contains(log.c_str(),
                  "EP_HOST_RING_SLOTS=\"four\" is not a 64-bit integer (decimal, or hex with 0x), using 4");
  assert_contains(log.c_str(), "EP WARN");
}

void int_accessor_unset_gives_default(void**) {
  assert_null(getenv("EP_TIMEOUT_MS"));
  assert_int_equal(ep::param::TIMEOUT_MS(), 60000);
  assert_null(getenv("EP_BUFFER_BYTES_CAP"));
  assert_int_equal(ep::param::BUFFER_BYTES_CAP(), 0);
  assert_null(getenv("EP_NODE_SIZE"));
  assert_int_equal(ep::param::NODE_SIZE(), 0);
}

void str_accessor_reads_once(void**) {
  setenv("EP_SHM_DIR", "/tmp/moeep-test-dir", 1);
  assert_string_equal(ep::param::SHM_DIR(), "/tmp/moeep-test-dir");
  setenv("EP_SHM_DIR", "/elsewhere", 1);
  assert_string_equal(ep::param::SHM_DIR(), "/tmp/moeep-test-dir");
  unsetenv("EP_SHM_DIR");
  assert_contains(readLog().c_str(), "EP_SHM_DIR set by environment to /tmp/moeep-test-dir");
}

// EP_COMM_SECRET: the accessor gives the secret, but neither the log nor
// epGetParam shows it; a file's name may be shown.
void secret_is_never_logged_or_shown(void**) {
  int index = -1;
  for (int i = 0; i < ep::paramCount(); i++)
    if (strcmp(ep::paramInfo(i).name, "COMM_SECRET") == 0) index = i;
  assert_true(index >= 0);
  assert_string_equal(ep::paramInfo(index).kind, "SECRET");
  setenv("EP_COMM_SECRET", "hunter2-do-not-print", 1);
  assert_string_equal(ep::param::COMM_SECRET(), "hunter2-do-not-print");
  const char* value = nullptr;
  assert_ok(epGetParam(index, nullptr, nullptr, &value, nullptr));
  assert_non_null(value);
  assert_string_equal(value, "(set; not shown)");
  setenv("EP_COMM_SECRET", "file:/etc/moeep/secret", 1);
  assert_ok(epGetParam(index, nullptr, nullptr, &value, nullptr));
  assert_string_equal(value, "file:/etc/moeep/secret");
  unsetenv("EP_COMM_SECRET");
  const std::string log = readLog();
  assert_contains(log.c_str(), "EP_COMM_SECRET set by environment (not shown)");
  if (log.find("hunter2") != std::string::npos) print_error("the secret is in the log:\n%s\n", log.c_str());
  assert_true(log.find("hunter2") == std::string::npos);
}

void str_accessor_unset_gives_default(void**) {
  assert_null(getenv("EP_TRANSPORT_PATH"));
  assert_non_null(ep::param::TRANSPORT_PATH());
  assert_string_equal(ep::param::TRANSPORT_PATH(), "");
  // The log configuration itself went through the accessors.
  assert_string_equal(ep::param::DEBUG_SUBSYS(), "PARAMS");
}

void unknown_variable_warned_once_known_ones_not(void**) {
  setenv("EP_HOST_ID", "known-one", 1);
  ep::paramWarnUnknown();
  ep::paramWarnUnknown();
  unsetenv("EP_HOST_ID");
  std::string log = readLog();
  assert_int_equal(countOccurrences(log, "unknown variable EP_BOGUS_TEST_VARIABLE ignored"), 1);
  assert_int_equal(countOccurrences(log, "unknown variable EP_HOST_ID"), 0);
  assert_int_equal(countOccurrences(log, "unknown variable EP_DEBUG"), 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(table_is_not_empty_and_names_are_unique),
      cmocka_unit_test(table_names_are_upper_case_without_prefix),
      cmocka_unit_test(table_entries_have_doc_kind_and_default),
      cmocka_unit_test(table_has_the_documented_entries),
      cmocka_unit_test(parse_int64_accepts_decimal),
      cmocka_unit_test(parse_int64_accepts_hex),
      cmocka_unit_test(parse_int64_accepts_negatives),
      cmocka_unit_test(parse_int64_rejects_garbage_and_keeps_value),
      cmocka_unit_test(parse_int64_accepts_trailing_spaces_and_tabs),
      cmocka_unit_test(parse_int64_rejects_overflow),
      cmocka_unit_test(get_param_enumerates_every_entry_with_prefix),
      cmocka_unit_test(get_param_rejects_index_past_the_end_and_negative),
      cmocka_unit_test(get_param_value_follows_environment),
      cmocka_unit_test(param_env_reads_fresh_and_treats_empty_as_unset),
      cmocka_unit_test(int_accessor_reads_hex_once_and_logs_it),
      cmocka_unit_test(int_accessor_with_trailing_space),
      cmocka_unit_test(int_accessor_malformed_warns_and_keeps_default),
      cmocka_unit_test(int_accessor_unset_gives_default),
      cmocka_unit_test(str_accessor_reads_once),
      cmocka_unit_test(str_accessor_unset_gives_default),
      cmocka_unit_test(secret_is_never_logged_or_shown),
      cmocka_unit_test(unknown_variable_warned_once_known_ones_not),
  };
  return cmocka_run_group_tests_name("params", tests, groupSetup, groupTeardown);
}
