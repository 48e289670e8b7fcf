#!/usr/bin/env python3
"""libmoeep from Python through ctypes alone (no compiler, no binding code):
the versioned structs declared field by field from include/moeep.h, two host
ranks of one process (epCommInitAll), a dispatch and a combine from two
threads, every output checked; and an error with its message.

    python3 tests/ffi/ctypes_check.py build/lib/libmoeep.so
"""
import ctypes as C
import sys
import threading

EP_SUCCESS, EP_INVALID_ARGUMENT = 0, 4
EP_BFLOAT16, EP_INT64 = 0, 5
EP_BACKEND_HOST = 1


class Config(C.Structure):  # epConfig_t, EP_CONFIG_VERSION 1
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint),
                ("num_experts", C.c_int), ("hidden", C.c_int), ("max_tokens_per_rank", C.c_int),
                ("max_topk", C.c_int), ("dispatch_type", C.c_int), ("combine_type", C.c_int),
                ("backend", C.c_int), ("device", C.c_int), ("buffer_bytes_cap", C.c_size_t),
                ("timeout_ms", C.c_int), ("num_sms", C.c_int), ("max_nodes_per_token", C.c_int),
                ("low_latency", C.c_int)] + [(n, C.c_int) for n in (
                    "ib_sl_throughput", "ib_sl_low_latency", "ib_sl_control", "ib_traffic_class",
                    "ib_gid_index", "ib_qps_per_peer", "ib_ar_throughput", "ib_ar_low_latency",
                    "ib_ar_control")]


class DispatchArgs(C.Structure):  # epDispatchArgs_t, EP_DISPATCH_ARGS_VERSION 1
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("flags", C.c_uint),
                ("x", C.c_void_p), ("x_type", C.c_int), ("x_stride", C.c_size_t),
                ("x_scales", C.c_void_p), ("scales_token_stride", C.c_size_t),
                ("scales_block_stride", C.c_size_t), ("topk_idx", C.c_void_p), ("topk_idx_type", C.c_int),
                ("topk_weights", C.c_void_p), ("num_tokens", C.c_int), ("num_topk", C.c_int),
                ("expert_alignment", C.c_int), ("recv_x", C.c_void_p), ("recv_scales", C.c_void_p),
                ("recv_topk_idx", C.c_void_p), ("recv_topk_weights", C.c_void_p),
                ("recv_capacity", C.c_int64), ("recv_tokens_per_expert", C.c_void_p),
                ("num_recv", C.c_void_p)]


class CombineArgs(C.Structure):  # epCombineArgs_t, EP_COMBINE_ARGS_VERSION 1
    _fields_ = [("size", C.c_size_t), ("magic", C.c_uint), ("version", C.c_uint), ("flags", C.c_uint),
                ("y", C.c_void_p), ("y_type", C.c_int), ("y_stride", C.c_size_t),
                ("recv_topk_weights", C.c_void_p), ("num_topk", C.c_int), ("bias", C.c_void_p),
                ("out", C.c_void_p), ("out_topk_weights", C.c_void_p)]


def versioned(cls, magic):
    """The struct as its INITIALIZER macro makes it: size, magic, version 1, -1 where the header says so."""
    s = cls()
    s.size, s.magic, s.version = C.sizeof(cls), magic, 1
    return s


def config(lib_hidden):
    cfg = versioned(Config, 0x65704366)
    cfg.num_experts, cfg.hidden, cfg.max_tokens_per_rank, cfg.max_topk = 8, lib_hidden, 16, 2
    cfg.dispatch_type = cfg.combine_type = EP_BFLOAT16
    cfg.backend, cfg.device = EP_BACKEND_HOST, -1
    for name, _ in Config._fields_:
        if name.startswith("ib_"):  # -1: not set (EP_CONFIG_INITIALIZER)
            setattr(cfg, name, -1)
    return cfg


def bf16(v):
    """BF16 bits of a float that BF16 holds exactly (small integers here)."""
    return C.c_uint32.from_buffer_copy(C.c_float(v)).value >> 16


def main():
    lib = C.CDLL(sys.argv[1] if len(sys.argv) > 1 else "build/lib/libmoeep.so")
    lib.epGetLastError.restype = C.c_char_p
    fails = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            fails.append(what)

    version = C.c_int(0)
    check(lib.epGetVersion(C.byref(version)) == EP_SUCCESS and version.value > 0,
          "epGetVersion: %d" % version.value)

    R, T, H, K = 2, 16, 64, 2
    comms = (C.c_void_p * R)()
    cfg = config(H)
    res = lib.epCommInitAll(comms, R, None, C.byref(cfg))
    check(res == EP_SUCCESS, "epCommInitAll of %d host ranks (%s)" % (R, lib.epGetLastError(None).decode()))
    if res != EP_SUCCESS:
        return 1

    # Rank r's token t is the row r * 100 + t (exact in BF16); it chooses
    # experts t % 8 and (3t + 1) % 8 (never the same: they differ by 2t + 1,
    # which is odd), so it goes to 1 or 2 ranks (rank r holds experts 4r..4r+3).
    results = [None] * R

    def rank(r):
        x = (C.c_uint16 * (T * H))(*[bf16(r * 100 + t) for t in range(T) for _ in range(H)])
        idx = (C.c_int64 * (T * K))(*[e for t in range(T) for e in (t % 8, (t * 3 + 1) % 8)])
        cap = R * T
        recv_x = (C.c_uint16 * (cap * H))()
        num_recv = C.c_int64(-1)
        d = versioned(DispatchArgs, 0x65704469)
        d.x, d.x_type, d.topk_idx, d.topk_idx_type = C.addressof(x), EP_BFLOAT16, C.addressof(idx), EP_INT64
        d.num_tokens, d.num_topk = T, K
        d.recv_x, d.recv_capacity, d.num_recv = C.addressof(recv_x), cap, C.addressof(num_recv)
        handle = C.c_void_p(None)
        rd = lib.epDispatch(C.c_void_p(comms[r]), C.byref(d), C.byref(handle), None)
        out = (C.c_uint16 * (T * H))()
        c = versioned(CombineArgs, 0x6570436f)
        c.y, c.y_type, c.out = C.addressof(recv_x), EP_BFLOAT16, C.addressof(out)  # y = what arrived
        rc = lib.epCombine(C.c_void_p(comms[r]), C.byref(c), handle, None) if rd == EP_SUCCESS else -1
        lib.epHandleDestroy(handle)
        results[r] = (rd, rc, num_recv.value, list(recv_x), list(out), x, idx)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(R)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for r in range(R):
        rd, rc, n, recv_x, out, _, _ = results[r]
        check(rd == EP_SUCCESS and rc == EP_SUCCESS, "rank %d: epDispatch %d, epCombine %d" % (r, rd, rc))
        # Expected rows on rank r: sources ascending, tokens ascending, the
        # tokens with an expert in [4r, 4r + 4).
        want = []
        for s in range(R):
            idx = results[s][6]
            for t in range(T):
                if any(idx[t * K + k] // 4 == r for k in range(K)):
                    want.append(s * 100 + t)
        check(n == len(want), "rank %d: num_recv %d, expected %d" % (r, n, len(want)))
        got = [recv_x[i * H] for i in range(min(n, len(want)))]
        rows_ok = got == [bf16(v) for v in want] and all(
            recv_x[i * H + j] == recv_x[i * H] for i in range(len(got)) for j in range(H))
        check(rows_ok, "rank %d: received rows by source rank then token" % r)
        # combine of y = the received rows: x times the ranks the token went to
        idx = results[r][6]
        exact = all(out[t * H + j] == bf16((r * 100 + t) * len({idx[t * K + k] // 4 for k in range(K)}))
                    for t in range(T) for j in range(H))
        check(exact, "rank %d: combine out = x * ranks reached" % r)

    for comm in comms:
        lib.epCommDestroy(C.c_void_p(comm))

    # An error from Python: hidden = 0 names the field.
    bad = config(0)
    one = (C.c_void_p * 1)()
    res = lib.epCommInitAll(one, 1, None, C.byref(bad))
    msg = lib.epGetLastError(None).decode()
    check(res == EP_INVALID_ARGUMENT and "hidden" in msg, "hidden = 0: %d, \"%s\"" % (res, msg))

    print("ctypes_check: %s" % ("all checks passed" if not fails else "%d FAILED" % len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
