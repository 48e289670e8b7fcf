#include "data_types.h"

namespace ep {

size_t dataTypeSize(epDataType_t t) {
  switch (t) {
    case epBfloat16: case epFloat16: return 2;
    case epFloat32: case epInt32: return 4;
    case epFloat8E4M3: return 1;
    case epInt64: return 8;
    default: return 0;
  }
}

const char* dataTypeName(epDataType_t t) {
  switch (t) {
    case epBfloat16: return "bf16";
    case epFloat16: return "fp16";
    case epFloat32: return "fp32";
    case epFloat8E4M3: return "fp8e4m3";
    case epInt32: return "int32";
    case epInt64: return "int64";
    default: return "unknown";
  }
}

}  // namespace ep
