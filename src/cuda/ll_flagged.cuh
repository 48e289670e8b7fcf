// Flagged records: how a low-latency dispatch of at most kLLFlagTokens tokens
// (src/ll_layout.h; fewer where llFlagTokensFit says so) reaches its receivers
// without a dispatch signal.
//
// A signal costs the sender a system-scope release per block (it waits until
// the block's stores to every peer are acknowledged) and the receiver a wait
// for the counter of every block of every source, then a round trip to load
// what the signal announced; at one token that is most of the call
// (docs/BENCHMARKS.md, the floor of a call). Here every 4 bytes of a record
// travel in an 8-byte word whose high half is the call's tag, stored with
// relaxed system-scope stores; an aligned 8-byte access is single-copy atomic,
// so a receiver that reads a word with this call's tag has its payload, and
// polls each word it needs until it does (the idea of NCCL's LL protocol).
// Half of each word is tag, so only small calls use it.
//
// What a flagged source sends, per token t < T into the flagged record [me][t]
// of every rank r of the set: the header words (K, the K expert ids with -1
// for none and padding, the weights) to every rank, whether or not the token
// chose one of r's experts, so that every receiver can number the tokens
// itself (no numbering, no counts); the row (FP8 or BF16 pieces, 8 bytes
// per word pair) and the FP8 scales to the ranks the token goes to. Its ntok
// word (tag, T, kLLNtokFlagged) is a relaxed system-scope store too.
// Every block still adds 1 to the dispatch counter of every rank (relaxed:
// nobody waits for it) so that the counter targets of later calls hold.
//
// A receiver learns per source from the ntok word which kind it sent; a call
// whose sources are all plain takes the kernels' own receive, any other the
// receive below, which reads both kinds.
#pragma once

#include "../ll_layout.h"
#include "ll_device.cuh"

namespace ep {
namespace cuda {

namespace {  // each kernel file has its own copy (llPollFlag is not inlined)

// Flagged record of (source src, token t) in rank r's set.
__device__ __forceinline__ uint64_t* llFlagRecord(const LLView& v, int r, int set, int src, int t) {
  return reinterpret_cast<uint64_t*>(llSet(v, r, set) + v.flag_off +
                                     (size_t(src) * kLLFlagTokens + t) * v.flag_rec_bytes);
}
// Its row: word pair i carries bytes [8i, 8i + 8) of the row as received.
__device__ __forceinline__ uint64_t* llFlagRow(const LLView& v, uint64_t* rec) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(rec) + v.flag_hdr_bytes);
}
// Its FP8 scales, one word each (after room for a BF16 row).
__device__ __forceinline__ uint64_t* llFlagScales(const LLView& v, uint64_t* rec) {
  return llFlagRow(v, rec) + size_t(v.hidden) / 2;
}

__device__ __forceinline__ uint64_t llFlagWord(uint32_t tag, uint32_t value) { return (uint64_t(tag) << 32) | value; }

__device__ __forceinline__ void llStFlag(uint64_t* p, uint32_t tag, uint32_t a) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(llFlagWord(tag, a)) : "memory");
}
// Two words, one 16-byte store (p 16-byte aligned): each word is atomic, and
// each carries the tag.
__device__ __forceinline__ void llStFlag2(uint64_t* p, uint32_t tag, uint32_t a, uint32_t b) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(llFlagWord(tag, a)),
               "l"(llFlagWord(tag, b))
               : "memory");
}

__device__ __forceinline__ void llStRelaxed64(uint64_t* p, uint64_t w) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

// Adds 1 to dispatch counter [set][me] in every rank, relaxed: a flagged
// source's receivers do not wait for it, but the counter targets of later
// calls count every block of every call.
__device__ __forceinline__ void llCountRelaxed(const LLView& v, LLCounter kind, int set) {
  if (threadIdx.x < v.nranks && !llIsDead(v, threadIdx.x))
    asm volatile("red.relaxed.sys.global.add.u64 [%0], 1;" ::"l"(llCounter(v, threadIdx.x, kind, set, v.rank))
                 : "memory");
}

// Polls until the word at p (n = 1) or both words at p (n = 2, 16-byte
// aligned) carry `tag`; the payloads in a (and b). False after the timeout or
// once the source's process exited (reported, what = kLLWhatDispatch), or
// when another wait of this rank failed (device.cuh: spinLoop).
__device__ __noinline__ bool llPollFlag(const LLView& v, const uint64_t* p, int n, uint32_t tag, int peer,
                                        uint32_t& a, uint32_t& b) {
  ulonglong2 w;
  const bool ok = spinLoop(
      v.local, v.timeout_ns, peer, &w,
      [&] {
        ulonglong2 r;
        r.y = uint64_t(tag) << 32;  // the second word of n = 1: passes the test below
        if (n == 2)
          asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(r.x), "=l"(r.y) : "l"(p) : "memory");
        else
          asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(r.x) : "l"(p) : "memory");
        return r;
      },
      [&](const ulonglong2& r) { return uint32_t(r.x >> 32) == tag && uint32_t(r.y >> 32) == tag; },
      [&](int code, const ulonglong2& r) { llReportFailedWait(v, code, kLLWhatDispatch, peer, tag, (long long)(r.x >> 32)); });
  a = uint32_t(w.x);
  b = uint32_t(w.y);
  return ok;
}

// The four words w of a flagged piece at p, loaded before: their payloads,
// each word pair that did not carry `tag` yet polled until it does.
__device__ __forceinline__ int4 llFlagPieceCheck(const LLView& v, const uint64_t* p, const uint64_t (&w)[4],
                                                 uint32_t tag, int peer) {
  uint32_t a = uint32_t(w[0]), b = uint32_t(w[1]), c = uint32_t(w[2]), d = uint32_t(w[3]);
  if (uint32_t(w[0] >> 32) != tag || uint32_t(w[1] >> 32) != tag) llPollFlag(v, p, 2, tag, peer, a, b);
  if (uint32_t(w[2] >> 32) != tag || uint32_t(w[3] >> 32) != tag) llPollFlag(v, p + 2, 2, tag, peer, c, d);
  return make_int4(int(a), int(b), int(c), int(d));
}

// Output piece j (16 bytes) of a flagged row: both word pairs loaded at once,
// then polled one by one only if one was not there yet.
__device__ __forceinline__ int4 llFlagPiece(const LLView& v, const uint64_t* row, int j, uint32_t tag, int peer) {
  const uint64_t* p = row + 4 * size_t(j);
  uint64_t w[4];
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[0]), "=l"(w[1]) : "l"(p) : "memory");
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(w[2]), "=l"(w[3]) : "l"(p + 2) : "memory");
  return llFlagPieceCheck(v, p, w, tag, peer);
}

// Thread s < R: source s's ntok word of this pair (tag in the high half),
// polled until it is this pair's; 0 after a failed wait (reported).
__device__ __forceinline__ uint64_t llPollNtok(const LLView& v, const uint64_t* p, uint32_t tag, int src) {
  uint64_t got = 0;
  const bool ok = spinWait(
      p, v.local, v.timeout_ns, src, &got, [&](uint64_t w) { return uint32_t(w >> 32) == tag; },
      [&](int code, uint64_t w) { llReportFailedWait(v, code, kLLWhatDispatch, src, tag, (long long)(w >> 32)); });
  return ok ? got : 0;
}

}  // namespace
}  // namespace cuda
}  // namespace ep
