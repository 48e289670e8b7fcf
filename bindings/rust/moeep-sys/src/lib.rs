//! Raw bindings to libmoeep's C ABI, `include/moeep.h`, version 1 of every
//! struct. Names, fields and values are the header's; `tests/layout.rs`
//! compares every struct's size and field offsets with the C compiler's.
//! The `*_INITIALIZER` macros are the `initializer()` functions. See the
//! `moeep` crate for a safe API.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::mem::size_of;
use std::os::raw::{c_char, c_int, c_uint, c_void};

pub const EP_VERSION_MAJOR: c_int = 0;
pub const EP_VERSION_MINOR: c_int = 1;
pub const EP_VERSION_PATCH: c_int = 0;
pub const EP_VERSION_CODE: c_int = EP_VERSION_MAJOR * 10000 + EP_VERSION_MINOR * 100 + EP_VERSION_PATCH;

// C enums: int-sized (the layout test holds the structs that carry them to it).
pub type epResult_t = c_int;
pub const epSuccess: epResult_t = 0;
pub const epUnhandledCudaError: epResult_t = 1;
pub const epSystemError: epResult_t = 2;
pub const epInternalError: epResult_t = 3;
pub const epInvalidArgument: epResult_t = 4;
pub const epInvalidUsage: epResult_t = 5;
pub const epRemoteError: epResult_t = 6;
pub const epInProgress: epResult_t = 7;
pub const epTimeout: epResult_t = 8;
pub const epNotSupported: epResult_t = 9;
pub const epAborted: epResult_t = 10;
pub const epOutOfMemory: epResult_t = 11;

pub type epDataType_t = c_int;
pub const epBfloat16: epDataType_t = 0;
pub const epFloat16: epDataType_t = 1;
pub const epFloat32: epDataType_t = 2;
pub const epFloat8E4M3: epDataType_t = 3;
pub const epInt32: epDataType_t = 4;
pub const epInt64: epDataType_t = 5;

pub type epBackend_t = c_int;
pub const epBackendAuto: epBackend_t = 0;
pub const epBackendHost: epBackend_t = 1;
pub const epBackendCuda: epBackend_t = 2;

pub type epPathKind_t = c_int;
pub const epPathSelf: epPathKind_t = 0;
pub const epPathNvlink: epPathKind_t = 1;
pub const epPathHostStaged: epPathKind_t = 2;
pub const epPathRail: epPathKind_t = 3;
pub const epPathRailForward: epPathKind_t = 4;

/// Opaque communicator.
#[repr(C)]
pub struct epComm {
    _private: [u8; 0],
}
pub type epComm_t = *mut epComm;
/// Opaque routing handle.
#[repr(C)]
pub struct epHandle {
    _private: [u8; 0],
}
pub type epHandle_t = *mut epHandle;
/// What `cudaStream_t` points to; null on the host backend.
#[repr(C)]
pub struct CUstream_st {
    _private: [u8; 0],
}
pub type epStream_t = *mut CUstream_st;

pub const EP_UNIQUE_ID_BYTES: usize = 128;
#[repr(C)]
#[derive(Clone, Copy)]
pub struct epUniqueId {
    pub internal: [c_char; EP_UNIQUE_ID_BYTES],
}

pub const EP_CONFIG_MAGIC: c_uint = 0x6570_4366;
pub const EP_LAYOUT_ARGS_MAGIC: c_uint = 0x6570_4c61;
pub const EP_DISPATCH_ARGS_MAGIC: c_uint = 0x6570_4469;
pub const EP_COMBINE_ARGS_MAGIC: c_uint = 0x6570_436f;
pub const EP_LL_DISPATCH_ARGS_MAGIC: c_uint = 0x6570_4c64;
pub const EP_LL_COMBINE_ARGS_MAGIC: c_uint = 0x6570_4c63;

pub const EP_CONFIG_VERSION: c_uint = 3;
pub const EP_LAYOUT_ARGS_VERSION: c_uint = 1;
pub const EP_COMM_PEER_INFO_MAGIC: c_uint = 0x6570_5069;
pub const EP_COMM_PEER_INFO_VERSION: c_uint = 1;
pub const EP_PEER_TRAFFIC_CLASSES: usize = 3;
pub const EP_DISPATCH_ARGS_VERSION: c_uint = 1;
pub const EP_COMBINE_ARGS_VERSION: c_uint = 1;
pub const EP_LL_DISPATCH_ARGS_VERSION: c_uint = 1;
pub const EP_LL_COMBINE_ARGS_VERSION: c_uint = 1;

pub const EP_DISPATCH_NO_HOST_SYNC: c_uint = 0x1;
pub const EP_COMBINE_DETERMINISTIC: c_uint = 0x1;
pub const EP_LL_SEND_ONLY: c_uint = 0x1;
pub const EP_LL_ROUND_SCALE_POW2: c_uint = 0x2;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct epConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub num_experts: c_int,
    pub hidden: c_int,
    pub max_tokens_per_rank: c_int,
    pub max_topk: c_int,
    pub dispatch_type: epDataType_t,
    pub combine_type: epDataType_t,
    pub backend: epBackend_t,
    pub device: c_int,
    pub buffer_bytes_cap: usize,
    pub timeout_ms: c_int,
    pub num_sms: c_int,
    pub max_nodes_per_token: c_int,
    pub low_latency: c_int,
    pub ib_sl_throughput: c_int,
    pub ib_sl_low_latency: c_int,
    pub ib_sl_control: c_int,
    pub ib_traffic_class: c_int,
    pub ib_gid_index: c_int,
    pub ib_qps_per_peer: c_int,
    pub ib_ar_throughput: c_int,
    pub ib_ar_low_latency: c_int,
    pub ib_ar_control: c_int,
    pub ib_tc_throughput: c_int,
    pub ib_tc_low_latency: c_int,
    pub ib_tc_control: c_int,
    pub ib_timeout: c_int,
    pub ib_retry_cnt: c_int,
    pub ib_qp_budget: c_int,
    /// Version 3.
    pub enable_shrink: c_int,
}

impl epConfig_t {
    /// EP_CONFIG_INITIALIZER
    pub fn initializer() -> Self {
        epConfig_t {
            size: size_of::<Self>(),
            magic: EP_CONFIG_MAGIC,
            version: EP_CONFIG_VERSION,
            num_experts: 0,
            hidden: 0,
            max_tokens_per_rank: 0,
            max_topk: 0,
            dispatch_type: epBfloat16,
            combine_type: epBfloat16,
            backend: epBackendAuto,
            device: -1,
            buffer_bytes_cap: 0,
            timeout_ms: 0,
            num_sms: 0,
            max_nodes_per_token: 0,
            low_latency: 0,
            ib_sl_throughput: -1,
            ib_sl_low_latency: -1,
            ib_sl_control: -1,
            ib_traffic_class: -1,
            ib_gid_index: -1,
            ib_qps_per_peer: -1,
            ib_ar_throughput: -1,
            ib_ar_low_latency: -1,
            ib_ar_control: -1,
            ib_tc_throughput: -1,
            ib_tc_low_latency: -1,
            ib_tc_control: -1,
            ib_timeout: -1,
            ib_retry_cnt: -1,
            ib_qp_budget: -1,
            enable_shrink: 0,
        }
    }
}

/// What is asked of the fabric for one traffic class of a network peer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct epPeerClassInfo_t {
    pub service_level: c_int,
    pub traffic_class: c_int,
    pub adaptive_routing: c_int,
}

/// How this rank reaches one peer (epCommPeerInfo).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct epCommPeerInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub peer: c_int,
    pub node: c_int,
    pub path: epPathKind_t,
    pub via_rank: c_int,
    pub transport: [c_char; 32],
    pub device: [c_char; 64],
    pub port: c_int,
    pub qps: c_int,
    pub link: [c_char; 32],
    pub classes: [epPeerClassInfo_t; EP_PEER_TRAFFIC_CLASSES],
    pub detail: [c_char; 128],
}

impl epCommPeerInfo_t {
    /// EP_COMM_PEER_INFO_INITIALIZER
    pub fn initializer() -> Self {
        epCommPeerInfo_t {
            size: size_of::<Self>(),
            magic: EP_COMM_PEER_INFO_MAGIC,
            version: EP_COMM_PEER_INFO_VERSION,
            peer: 0,
            node: 0,
            path: epPathSelf,
            via_rank: -1,
            transport: [0; 32],
            device: [0; 64],
            port: 0,
            qps: 0,
            link: [0; 32],
            classes: [epPeerClassInfo_t::default(); EP_PEER_TRAFFIC_CLASSES],
            detail: [0; 128],
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct epLayoutArgs_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub topk_idx: *const c_void,
    pub topk_idx_type: epDataType_t,
    pub num_tokens: c_int,
    pub num_topk: c_int,
    pub tokens_per_rank: *mut c_int,
    pub tokens_per_node: *mut c_int,
    pub tokens_per_expert: *mut c_int,
    pub is_token_in_rank: *mut u8,
}

impl epLayoutArgs_t {
    /// EP_LAYOUT_ARGS_INITIALIZER
    pub fn initializer() -> Self {
        epLayoutArgs_t {
            size: size_of::<Self>(),
            magic: EP_LAYOUT_ARGS_MAGIC,
            version: EP_LAYOUT_ARGS_VERSION,
            topk_idx: std::ptr::null(),
            topk_idx_type: epInt64,
            num_tokens: 0,
            num_topk: 0,
            tokens_per_rank: std::ptr::null_mut(),
            tokens_per_node: std::ptr::null_mut(),
            tokens_per_expert: std::ptr::null_mut(),
            is_token_in_rank: std::ptr::null_mut(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct epDispatchArgs_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub flags: c_uint,
    pub x: *const c_void,
    pub x_type: epDataType_t,
    pub x_stride: usize,
    pub x_scales: *const f32,
    pub scales_token_stride: usize,
    pub scales_block_stride: usize,
    pub topk_idx: *const c_void,
    pub topk_idx_type: epDataType_t,
    pub topk_weights: *const f32,
    pub num_tokens: c_int,
    pub num_topk: c_int,
    pub expert_alignment: c_int,
    pub recv_x: *mut c_void,
    pub recv_scales: *mut f32,
    pub recv_topk_idx: *mut i64,
    pub recv_topk_weights: *mut f32,
    pub recv_capacity: i64,
    pub recv_tokens_per_expert: *mut c_int,
    pub num_recv: *mut i64,
}

impl epDispatchArgs_t {
    /// EP_DISPATCH_ARGS_INITIALIZER
    pub fn initializer() -> Self {
        epDispatchArgs_t {
            size: size_of::<Self>(),
            magic: EP_DISPATCH_ARGS_MAGIC,
            version: EP_DISPATCH_ARGS_VERSION,
            flags: 0,
            x: std::ptr::null(),
            x_type: epBfloat16,
            x_stride: 0,
            x_scales: std::ptr::null(),
            scales_token_stride: 0,
            scales_block_stride: 0,
            topk_idx: std::ptr::null(),
            topk_idx_type: epInt64,
            topk_weights: std::ptr::null(),
            num_tokens: 0,
            num_topk: 0,
            expert_alignment: 0,
            recv_x: std::ptr::null_mut(),
            recv_scales: std::ptr::null_mut(),
            recv_topk_idx: std::ptr::null_mut(),
            recv_topk_weights: std::ptr::null_mut(),
            recv_capacity: 0,
            recv_tokens_per_expert: std::ptr::null_mut(),
            num_recv: std::ptr::null_mut(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct epCombineArgs_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub flags: c_uint,
    pub y: *const c_void,
    pub y_type: epDataType_t,
    pub y_stride: usize,
    pub recv_topk_weights: *const f32,
    pub num_topk: c_int,
    pub bias: *const c_void,
    pub out: *mut c_void,
    pub out_topk_weights: *mut f32,
}

impl epCombineArgs_t {
    /// EP_COMBINE_ARGS_INITIALIZER
    pub fn initializer() -> Self {
        epCombineArgs_t {
            size: size_of::<Self>(),
            magic: EP_COMBINE_ARGS_MAGIC,
            version: EP_COMBINE_ARGS_VERSION,
            flags: 0,
            y: std::ptr::null(),
            y_type: epBfloat16,
            y_stride: 0,
            recv_topk_weights: std::ptr::null(),
            num_topk: 0,
            bias: std::ptr::null(),
            out: std::ptr::null_mut(),
            out_topk_weights: std::ptr::null_mut(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct epLowLatencyDispatchArgs_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub flags: c_uint,
    pub x: *const c_void,
    pub topk_idx: *const c_void,
    pub topk_idx_type: epDataType_t,
    pub topk_weights: *const f32,
    pub num_tokens: c_int,
    pub num_topk: c_int,
    pub wire_type: epDataType_t,
    pub recv_x: *mut c_void,
    pub recv_scales: *mut f32,
    pub recv_count: *mut c_int,
    pub recv_src: *mut c_int,
}

impl epLowLatencyDispatchArgs_t {
    /// EP_LL_DISPATCH_ARGS_INITIALIZER
    pub fn initializer() -> Self {
        epLowLatencyDispatchArgs_t {
            size: size_of::<Self>(),
            magic: EP_LL_DISPATCH_ARGS_MAGIC,
            version: EP_LL_DISPATCH_ARGS_VERSION,
            flags: 0,
            x: std::ptr::null(),
            topk_idx: std::ptr::null(),
            topk_idx_type: epInt64,
            topk_weights: std::ptr::null(),
            num_tokens: 0,
            num_topk: 0,
            wire_type: epFloat8E4M3,
            recv_x: std::ptr::null_mut(),
            recv_scales: std::ptr::null_mut(),
            recv_count: std::ptr::null_mut(),
            recv_src: std::ptr::null_mut(),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct epLowLatencyCombineArgs_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub flags: c_uint,
    pub y: *const c_void,
    pub out: *mut c_void,
}

impl epLowLatencyCombineArgs_t {
    /// EP_LL_COMBINE_ARGS_INITIALIZER
    pub fn initializer() -> Self {
        epLowLatencyCombineArgs_t {
            size: size_of::<Self>(),
            magic: EP_LL_COMBINE_ARGS_MAGIC,
            version: EP_LL_COMBINE_ARGS_VERSION,
            flags: 0,
            y: std::ptr::null(),
            out: std::ptr::null_mut(),
        }
    }
}

extern "C" {
    pub fn epGetVersion(version: *mut c_int) -> epResult_t;
    pub fn epGetErrorString(result: epResult_t) -> *const c_char;
    pub fn epGetLastError(comm: epComm_t) -> *const c_char;
    pub fn epGetParam(
        index: c_int,
        name: *mut *const c_char,
        default_value: *mut *const c_char,
        value: *mut *const c_char,
        doc: *mut *const c_char,
    ) -> epResult_t;
    pub fn epGetTransport(index: c_int, name: *mut *const c_char, available: *mut c_int, detail: *mut *const c_char)
        -> epResult_t;
    pub fn epGetUniqueId(unique_id: *mut epUniqueId) -> epResult_t;
    pub fn epCommInitRank(
        comm: *mut epComm_t,
        nranks: c_int,
        unique_id: epUniqueId,
        rank: c_int,
        config: *const epConfig_t,
    ) -> epResult_t;
    pub fn epCommInitAll(comms: *mut epComm_t, nranks: c_int, devices: *const c_int, config: *const epConfig_t)
        -> epResult_t;
    pub fn epCommDestroy(comm: epComm_t) -> epResult_t;
    pub fn epCommAbort(comm: epComm_t) -> epResult_t;
    pub fn epCommShrink(
        comm: epComm_t,
        suspects: *const c_int,
        nsuspects: c_int,
        dead: *mut c_int,
        ndead: *mut c_int,
    ) -> epResult_t;
    pub fn epCommDeadRanks(
        comm: epComm_t,
        dead: *mut c_int,
        capacity: c_int,
        ndead: *mut c_int,
        epoch: *mut c_uint,
    ) -> epResult_t;
    pub fn epCommRank(comm: epComm_t, rank: *mut c_int) -> epResult_t;
    pub fn epCommSize(comm: epComm_t, size: *mut c_int) -> epResult_t;
    pub fn epCommLocalExperts(comm: epComm_t, first: *mut c_int, count: *mut c_int) -> epResult_t;
    pub fn epCommBufferBytes(comm: epComm_t, bytes: *mut usize) -> epResult_t;
    pub fn epCommNodes(comm: epComm_t, num_nodes: *mut c_int, node_of_rank: *mut c_int) -> epResult_t;
    pub fn epTopologyReport(
        xml_path: *const c_char,
        ranks_per_node: c_int,
        num_nodes: c_int,
        buf: *mut c_char,
        bytes: *mut usize,
    ) -> epResult_t;
    pub fn epCommPlanReport(comm: epComm_t, buf: *mut c_char, bytes: *mut usize) -> epResult_t;
    pub fn epCommPeerPath(comm: epComm_t, peer: c_int, kind: *mut epPathKind_t, via_rank: *mut c_int) -> epResult_t;
    pub fn epCommPeerInfo(comm: epComm_t, peer: c_int, info: *mut epCommPeerInfo_t) -> epResult_t;
    pub fn epLayout(comm: epComm_t, args: *const epLayoutArgs_t, stream: epStream_t) -> epResult_t;
    pub fn epDispatchPrepare(
        comm: epComm_t,
        args: *const epDispatchArgs_t,
        handle: *mut epHandle_t,
        stream: epStream_t,
    ) -> epResult_t;
    pub fn epDispatch(comm: epComm_t, args: *const epDispatchArgs_t, handle: *mut epHandle_t, stream: epStream_t)
        -> epResult_t;
    pub fn epHandleRecvCount(handle: epHandle_t, num_recv: *mut i64) -> epResult_t;
    pub fn epHandleDestroy(handle: epHandle_t) -> epResult_t;
    pub fn epCombine(comm: epComm_t, args: *const epCombineArgs_t, handle: epHandle_t, stream: epStream_t)
        -> epResult_t;
    pub fn epLowLatencyBufferBytes(config: *const epConfig_t, nranks: c_int, bytes: *mut usize) -> epResult_t;
    pub fn epLowLatencyDispatch(
        comm: epComm_t,
        args: *const epLowLatencyDispatchArgs_t,
        handle: *mut epHandle_t,
        stream: epStream_t,
    ) -> epResult_t;
    pub fn epLowLatencyCombine(
        comm: epComm_t,
        args: *const epLowLatencyCombineArgs_t,
        handle: epHandle_t,
        stream: epStream_t,
    ) -> epResult_t;
    pub fn epLowLatencyComplete(comm: epComm_t, handle: epHandle_t, stream: epStream_t) -> epResult_t;
}
