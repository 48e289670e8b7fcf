// EP_* parameters, all from params.def. The library never calls setenv.
#pragma once

#include <cstdint>

namespace ep {
namespace param {
#define EP_PARAM_INT_DECL(NAME) int64_t NAME();
#define EP_PARAM_STR_DECL(NAME) const char* NAME();
#define EP_PARAM_SECRET_DECL(NAME) const char* NAME();
#define EP_PARAM(NAME, KIND, DEFAULT, DOC) EP_PARAM_##KIND##_DECL(NAME)
#include "params.def"
#undef EP_PARAM
#undef EP_PARAM_INT_DECL
#undef EP_PARAM_STR_DECL
#undef EP_PARAM_SECRET_DECL
}  // namespace param

struct ParamInfo {
  const char* name;           // without the EP_ prefix
  const char* kind;           // "INT", "STR" or "SECRET" (a STR never logged or shown)
  const char* default_value;  // as text
  const char* doc;
};
int paramCount();
const ParamInfo& paramInfo(int index);
// Raw value from the environment, or nullptr when unset.
const char* paramEnv(const char* name);
// What may be shown of a parameter's value (epGetParam, moeep_info): the raw
// value, except for a SECRET, of which only a file name is shown.
const char* paramShownValue(const ParamInfo& p);
// Warns once per process about EP_* variables that are not in the table.
void paramWarnUnknown();
// Parses an integer parameter value; false when it is not a plain integer.
bool parseInt64(const char* text, int64_t* value);

}  // namespace ep
