#include "params.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "debug.h"

extern char** environ;

namespace ep {

namespace {
const ParamInfo kParams[] = {
#define EP_PARAM_INT_INFO(NAME, DEFAULT, DOC) {#NAME, "INT", #DEFAULT, DOC},
#define EP_PARAM_STR_INFO(NAME, DEFAULT, DOC) {#NAME, "STR", DEFAULT, DOC},
#define EP_PARAM_SECRET_INFO(NAME, DEFAULT, DOC) {#NAME, "SECRET", DEFAULT, DOC},
#define EP_PARAM(NAME, KIND, DEFAULT, DOC) EP_PARAM_##KIND##_INFO(NAME, DEFAULT, DOC)
#include "params.def"
#undef EP_PARAM
#undef EP_PARAM_INT_INFO
#undef EP_PARAM_STR_INFO
#undef EP_PARAM_SECRET_INFO
};
constexpr int kNumParams = sizeof(kParams) / sizeof(kParams[0]);

std::string envName(const char* name) { return std::string("EP_") + name; }
}  // namespace

bool parseInt64(const char* text, int64_t* value) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  // Decimal, or hexadecimal with 0x; a leading 0 is not octal (EP_X=010 is ten).
  const char* digits = text;
  while (*digits == ' ' || *digits == '\t') digits++;
  const char* after_sign = (*digits == '-' || *digits == '+') ? digits + 1 : digits;
  const int base = (after_sign[0] == '0' && (after_sign[1] == 'x' || after_sign[1] == 'X')) ? 16 : 10;
  long long v = strtoll(text, &end, base);
  if (errno != 0 || end == text) return false;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\0') return false;
  *value = v;
  return true;
}

int paramCount() { return kNumParams; }
const ParamInfo& paramInfo(int index) { return kParams[index]; }

const char* paramEnv(const char* name) {
  const char* v = getenv(envName(name).c_str());
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

const char* paramShownValue(const ParamInfo& p) {
  const char* value = paramEnv(p.name);
  if (value == nullptr || strcmp(p.kind, "SECRET") != 0) return value;
  // A file's name says where the secret is, not what it is.
  return strncmp(value, "file:", 5) == 0 ? value : "(set; not shown)";
}

void paramWarnUnknown() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      if (strncmp(*e, "EP_", 3) != 0) continue;
      const char* eq = strchr(*e, '=');
      size_t len = eq ? size_t(eq - *e) - 3 : strlen(*e) - 3;
      bool known = false;
      for (int i = 0; i < kNumParams && !known; i++)
        known = strlen(kParams[i].name) == len && strncmp(kParams[i].name, *e + 3, len) == 0;
      if (!known) EP_WARN(kSubsysParams, "unknown variable %.*s ignored", int(len + 3), *e);
    }
  });
}

namespace param {
// Each accessor reads its variable once; a malformed integer warns and keeps the default.
#define EP_PARAM_INT_DEF(NAME, DEFAULT)                                                \
  int64_t NAME() {                                                                     \
    static int64_t value = [] {                                                        \
      int64_t v = DEFAULT;                                                             \
      const char* text = paramEnv(#NAME);                                              \
      if (text != nullptr) {                                                           \
        if (parseInt64(text, &v))                                                      \
          EP_INFO(kSubsysParams, "EP_%s set by environment to %lld", #NAME, (long long)v); \
        else {                                                                         \
          v = DEFAULT;                                                                 \
          EP_WARN(kSubsysParams,                                                       \
                  "EP_%s=\"%s\" is not a 64-bit integer (decimal, or hex with 0x), "       \
                  "using %lld",                                                        \
                  #NAME, text, (long long)v);                                          \
        }                                                                              \
      }                                                                                \
      return v;                                                                        \
    }();                                                                               \
    return value;                                                                      \
  }
#define EP_PARAM_STR_DEF(NAME, DEFAULT)                                                \
  const char* NAME() {                                                                 \
    static const char* value = [] {                                                    \
      const char* text = paramEnv(#NAME);                                              \
      if (text == nullptr) return (const char*)DEFAULT;                                \
      if (strcmp(#NAME, "DEBUG") != 0 && strcmp(#NAME, "DEBUG_SUBSYS") != 0 &&         \
          strcmp(#NAME, "DEBUG_FILE") != 0)                                            \
        EP_INFO(kSubsysParams, "EP_%s set by environment to %s", #NAME, text);         \
      return (const char*)strdup(text);                                                \
    }();                                                                               \
    return value;                                                                      \
  }
// A secret is never logged, not even at INFO: logs travel further than the
// environment does. Only that it is set, and a file's name, are.
#define EP_PARAM_SECRET_DEF(NAME, DEFAULT)                                             \
  const char* NAME() {                                                                 \
    static const char* value = [] {                                                    \
      const char* text = paramEnv(#NAME);                                              \
      if (text == nullptr) return (const char*)DEFAULT;                                \
      EP_INFO(kSubsysParams, "EP_%s set by environment%s%s", #NAME,                    \
              strncmp(text, "file:", 5) == 0 ? " to " : " (not shown)",                \
              strncmp(text, "file:", 5) == 0 ? text : "");                             \
      return (const char*)strdup(text);                                                \
    }();                                                                               \
    return value;                                                                      \
  }
#define EP_PARAM(NAME, KIND, DEFAULT, DOC) EP_PARAM_##KIND##_DEF(NAME, DEFAULT)
#include "params.def"
#undef EP_PARAM
#undef EP_PARAM_INT_DEF
#undef EP_PARAM_STR_DEF
#undef EP_PARAM_SECRET_DEF
}  // namespace param

}  // namespace ep
