#include "records.h"

#include <cstring>

#include "../data_types.h"
#include "../sizes.h"
#include "convert.h"

namespace ep {
namespace host {

DispatchRecord dispatchRecord(const Config& c) {
  DispatchRecord r;
  r.row_bytes = size_t(c.hidden) * dataTypeSize(c.dispatch_type);
  r.scale_bytes = c.dispatch_type == epFloat8E4M3 ? size_t(fp8ScaleBlocks(c.hidden)) * 4 : 0;
  r.idx_bytes = size_t(c.max_topk) * 8;
  r.weight_bytes = size_t(c.max_topk) * 4;
  return r;
}

size_t combineRecordBytes(const Config& c) {
  return roundUp(size_t(c.hidden) * dataTypeSize(c.combine_type) + size_t(c.max_topk) * 4 + 4, 16);
}

size_t partialRecordBytes(const Config& c) {
  return roundUp(size_t(c.hidden) * 4 + size_t(c.max_topk) * 4 + 4, 16);
}

// acc[j] += row[j] for a row of type t: one loop per type so that the
// compiler vectorises it (combine's inner loop; -O2 alone does not).
__attribute__((optimize("O3"))) void addRowAsFloat(const void* row, epDataType_t t, int n, float* acc) {
  if (t == epBfloat16) {
    const uint16_t* r = static_cast<const uint16_t*>(row);
    for (int j = 0; j < n; j++) {
      uint32_t bits = uint32_t(r[j]) << 16;
      float v;
      memcpy(&v, &bits, 4);
      acc[j] += v;
    }
  } else if (t == epFloat32) {
    const float* r = static_cast<const float*>(row);
    for (int j = 0; j < n; j++) acc[j] += r[j];
  } else {
    for (int j = 0; j < n; j++) acc[j] += loadAsFloat(row, t, size_t(j));
  }
}

// row[j] = round(values[j]) in type t (BF16: floatToBf16 written without a
// branch, the same bits, so that the loop vectorises).
__attribute__((optimize("O3"))) void storeRowFromFloat(const float* values, epDataType_t t, int n, void* row) {
  if (t == epBfloat16) {
    uint16_t* r = static_cast<uint16_t*>(row);
    for (int j = 0; j < n; j++) {
      uint32_t bits;
      memcpy(&bits, &values[j], 4);
      const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
      const uint32_t quiet_nan = (bits >> 16) | 0x40u;
      r[j] = uint16_t(((bits & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
    }
  } else if (t == epFloat32) {
    memcpy(row, values, size_t(n) * 4);
  } else {
    for (int j = 0; j < n; j++) storeFromFloat(row, t, size_t(j), values[j]);
  }
}

}  // namespace host
}  // namespace ep
