//! Every struct of moeep.h, as the C compiler lays it out (build.rs measured
//! it), against the Rust declaration: the same size, the same fields in the
//! same order at the same offsets, each of the C field's size. Offsets are taken with addr_of! on an
//! uninitialised value (Rust 1.63 has no offset_of!).
use moeep_sys::*;
use std::mem::{size_of, MaybeUninit};
use std::ptr::addr_of;

include!(concat!(env!("OUT_DIR"), "/c_layout.rs"));

/// The size of what a raw pointer points to, without making a reference.
fn pointee_size<T>(_: *const T) -> usize {
    size_of::<T>()
}

/// (name, size, [(field, offset, size)]) of a Rust struct; a field missing from it fails to compile.
macro_rules! rust_layout {
    ($ty:ident { $($field:ident),* $(,)? }) => {{
        let value = MaybeUninit::<$ty>::uninit();
        let base = value.as_ptr();
        // SAFETY: addr_of! takes field addresses without reading the uninitialised value.
        let fields: Vec<(&'static str, usize, usize)> = vec![$((
            stringify!($field),
            unsafe { addr_of!((*base).$field) as usize - base as usize },
            pointee_size(unsafe { addr_of!((*base).$field) }),
        )),*];
        (stringify!($ty), size_of::<$ty>(), fields)
    }};
}

fn rust_layouts() -> Vec<(&'static str, usize, Vec<(&'static str, usize, usize)>)> {
    vec![
        rust_layout!(epUniqueId { internal }),
        rust_layout!(epConfig_t {
            size, magic, version, num_experts, hidden, max_tokens_per_rank, max_topk, dispatch_type,
            combine_type, backend, device, buffer_bytes_cap, timeout_ms, num_sms, max_nodes_per_token,
            low_latency, ib_sl_throughput, ib_sl_low_latency, ib_sl_control, ib_traffic_class, ib_gid_index,
            ib_qps_per_peer, ib_ar_throughput, ib_ar_low_latency, ib_ar_control, ib_tc_throughput, ib_tc_low_latency,
            ib_tc_control, ib_timeout, ib_retry_cnt, ib_qp_budget, enable_shrink
        }),
        rust_layout!(epLayoutArgs_t {
            size, magic, version, topk_idx, topk_idx_type, num_tokens, num_topk, tokens_per_rank,
            tokens_per_node, tokens_per_expert, is_token_in_rank
        }),
        rust_layout!(epDispatchArgs_t {
            size, magic, version, flags, x, x_type, x_stride, x_scales, scales_token_stride,
            scales_block_stride, topk_idx, topk_idx_type, topk_weights, num_tokens, num_topk,
            expert_alignment, recv_x, recv_scales, recv_topk_idx, recv_topk_weights, recv_capacity,
            recv_tokens_per_expert, num_recv
        }),
        rust_layout!(epCombineArgs_t {
            size, magic, version, flags, y, y_type, y_stride, recv_topk_weights, num_topk, bias, out,
            out_topk_weights
        }),
        rust_layout!(epLowLatencyDispatchArgs_t {
            size, magic, version, flags, x, topk_idx, topk_idx_type, topk_weights, num_tokens, num_topk,
            wire_type, recv_x, recv_scales, recv_count, recv_src
        }),
        rust_layout!(epLowLatencyCombineArgs_t { size, magic, version, flags, y, out }),
        rust_layout!(epPeerClassInfo_t { service_level, traffic_class, adaptive_routing }),
        rust_layout!(epCommPeerInfo_t {
            size, magic, version, peer, node, path, via_rank, transport, device, port, qps, link, classes, detail
        }),
    ]
}

#[test]
fn every_struct_matches_the_c_header() {
    let rust = rust_layouts();
    let mut problems = Vec::new();
    for (name, c_size, c_fields) in C_LAYOUT {
        match rust.iter().find(|(n, _, _)| n == name) {
            None => problems.push(format!("{}: in moeep.h, not declared in moeep-sys", name)),
            Some((_, size, fields)) => {
                if size != c_size {
                    problems.push(format!("{}: size {} in Rust, {} in C", name, size, c_size));
                }
                let c: Vec<(&str, usize, usize)> = c_fields.to_vec();
                if fields != &c {
                    problems.push(format!("{}: fields {:?} in Rust, {:?} in C", name, fields, c));
                }
            }
        }
    }
    for (name, _, _) in &rust {
        if !C_LAYOUT.iter().any(|(n, _, _)| n == name) {
            problems.push(format!("{}: declared in moeep-sys, not a struct of moeep.h", name));
        }
    }
    assert!(problems.is_empty(), "layout differences:\n{}", problems.join("\n"));
    assert_eq!(C_LAYOUT.len(), 9, "moeep.h's structs: {:?}", C_LAYOUT.iter().map(|s| s.0).collect::<Vec<_>>());
}

#[test]
fn initializers_fill_size_magic_and_version() {
    let c = epConfig_t::initializer();
    assert_eq!((c.size, c.magic, c.version, c.device, c.ib_ar_control), (size_of::<epConfig_t>(), EP_CONFIG_MAGIC, 3, -1, -1));
    assert_eq!((c.ib_tc_throughput, c.ib_timeout, c.ib_qp_budget), (-1, -1, -1));
    let d = epLowLatencyDispatchArgs_t::initializer();
    assert_eq!((d.magic, d.wire_type, d.topk_idx_type), (EP_LL_DISPATCH_ARGS_MAGIC, epFloat8E4M3, epInt64));
}

#[test]
fn the_library_links_and_reports_its_version() {
    let mut v = 0;
    // SAFETY: a valid pointer to an int.
    assert_eq!(unsafe { epGetVersion(&mut v) }, epSuccess);
    assert_eq!(v, EP_VERSION_CODE);
}
