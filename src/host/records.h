// The host backend's records on the wire, and the float32 row sums of combine.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../config.h"
#include "../sizes.h"
#include "moeep.h"

namespace ep {
namespace host {

// Bytes of one dispatched token on the wire: row, scales, expert ids,
// weights, and a word that says whether the sender carried ids and weights
// (a cached re-dispatch may not). To a rank the ids are its local ones; to a
// forwarder on another node (hier.h) they are global, and a mask of the
// node's ranks that take the token follows the word.
struct DispatchRecord {
  size_t row_bytes, scale_bytes, idx_bytes, weight_bytes;
  size_t flagOffset() const { return row_bytes + scale_bytes + idx_bytes + weight_bytes; }
  size_t maskOffset() const { return flagOffset() + 4; }
  size_t total() const { return roundUp(flagOffset() + 4, 16); }
  size_t forwardTotal() const { return roundUp(maskOffset() + 8, 16); }
};
DispatchRecord dispatchRecord(const Config& c);

// A combine record: the y row, the sender's recv_topk_weights row (max_topk
// floats of room) and how many of them it sent (0: it passed none).
size_t combineRecordBytes(const Config& c);
// A node's partial sum for one token (hier.h): the row in float32, the
// weights' sums, and the same count word.
size_t partialRecordBytes(const Config& c);

// acc[j] += row[j] for a row of type t.
void addRowAsFloat(const void* row, epDataType_t t, int n, float* acc);
// row[j] = round(values[j]) in type t.
void storeRowFromFloat(const float* values, epDataType_t t, int n, void* row);

}  // namespace host
}  // namespace ep
