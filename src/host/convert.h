// Rows of the library's element types read and written as float32. The
// 16-bit conversions (src/float16_bits.h) are the ones the CUDA kernels use.
#pragma once

#include <cstdint>
#include <cstring>

#include "../float16_bits.h"
#include "moeep.h"

namespace ep {

// Reads element i of a row of type t as float (t is BF16, FP16 or FP32).
inline float loadAsFloat(const void* row, epDataType_t t, size_t i) {
  switch (t) {
    case epBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(row)[i]);
    case epFloat16: return fp16ToFloat(static_cast<const uint16_t*>(row)[i]);
    default: return static_cast<const float*>(row)[i];
  }
}

inline void storeFromFloat(void* row, epDataType_t t, size_t i, float v) {
  switch (t) {
    case epBfloat16: static_cast<uint16_t*>(row)[i] = floatToBf16(v); break;
    case epFloat16: static_cast<uint16_t*>(row)[i] = floatToFp16(v); break;
    default: static_cast<float*>(row)[i] = v; break;
  }
}

}  // namespace ep
