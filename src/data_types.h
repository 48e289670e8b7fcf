// The element types of the public API (epDataType_t), their sizes and names,
// and how a caller's enum field is read without trusting its value.
#pragma once

#include <cstddef>
#include <cstring>

#include "moeep.h"

namespace ep {

// Bytes of one element; 0 for an unknown type.
size_t dataTypeSize(epDataType_t t);
// "bf16", "fp16", "fp32", "fp8e4m3", "int32", "int64"; "unknown" otherwise.
const char* dataTypeName(epDataType_t t);

// An enum field of a caller's struct, as the int it holds: a value outside
// the enum must not be loaded as the enum type (undefined behaviour).
template <typename E>
int rawEnum(const E& field) {
  static_assert(sizeof(E) == sizeof(int), "the C ABI's enums are ints");
  int v;
  memcpy(&v, &field, sizeof(v));
  return v;
}

}  // namespace ep
