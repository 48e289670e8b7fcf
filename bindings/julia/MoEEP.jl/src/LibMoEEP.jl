# The C ABI of libmoeep (include/moeep.h: epConfig_t at version 3, every other struct at version 1): structs
# with the header's names and fields, constants, and the library's path.
# tests/ffi/julia_layout_check.py compares these structs with the C
# compiler's layout and every ccall's argument list with the header.
module LibMoEEP

# MOEEP_LIBRARY (a file) when set, else the loader finds libmoeep.so.0.
const libmoeep = get(ENV, "MOEEP_LIBRARY", "libmoeep.so.0")

# epResult_t, epDataType_t, epBackend_t are C enums: Cint.
const epResult_t = Cint
const epSuccess = Cint(0)
const epInvalidArgument = Cint(4)
const epInvalidUsage = Cint(5)
const epDataType_t = Cint
const epBfloat16 = Cint(0)
const epFloat16 = Cint(1)
const epFloat32 = Cint(2)
const epFloat8E4M3 = Cint(3)
const epInt32 = Cint(4)
const epInt64 = Cint(5)
const epBackend_t = Cint
const epBackendAuto = Cint(0)
const epBackendHost = Cint(1)
const epBackendCuda = Cint(2)
const epPathKind_t = Cint

const EP_CONFIG_MAGIC = Cuint(0x65704366)
const EP_CONFIG_VERSION = 3  # every other struct is at version 1
const EP_DISPATCH_ARGS_MAGIC = Cuint(0x65704469)
const EP_COMBINE_ARGS_MAGIC = Cuint(0x6570436f)
const EP_LAYOUT_ARGS_MAGIC = Cuint(0x65704c61)
const EP_LL_DISPATCH_ARGS_MAGIC = Cuint(0x65704c64)
const EP_LL_COMBINE_ARGS_MAGIC = Cuint(0x65704c63)
const EP_COMM_PEER_INFO_MAGIC = Cuint(0x65705069)
const EP_PEER_TRAFFIC_CLASSES = 3
const EP_DISPATCH_NO_HOST_SYNC = Cuint(0x1)
const EP_LL_SEND_ONLY = Cuint(0x1)
const EP_LL_ROUND_SCALE_POW2 = Cuint(0x2)
const EP_UNIQUE_ID_BYTES = 128

const epComm_t = Ptr{Cvoid}
const epHandle_t = Ptr{Cvoid}
const epStream_t = Ptr{Cvoid}

struct epUniqueId
    internal::NTuple{128,UInt8}
end

# Immutable, as ccall passes them by Ref; build them with the keyword
# constructors below, which start from the header's *_INITIALIZER values.
struct epConfig_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    num_experts::Cint
    hidden::Cint
    max_tokens_per_rank::Cint
    max_topk::Cint
    dispatch_type::epDataType_t
    combine_type::epDataType_t
    backend::epBackend_t
    device::Cint
    buffer_bytes_cap::Csize_t
    timeout_ms::Cint
    num_sms::Cint
    max_nodes_per_token::Cint
    low_latency::Cint
    ib_sl_throughput::Cint
    ib_sl_low_latency::Cint
    ib_sl_control::Cint
    ib_traffic_class::Cint
    ib_gid_index::Cint
    ib_qps_per_peer::Cint
    ib_ar_throughput::Cint
    ib_ar_low_latency::Cint
    ib_ar_control::Cint
    ib_tc_throughput::Cint
    ib_tc_low_latency::Cint
    ib_tc_control::Cint
    ib_timeout::Cint
    ib_retry_cnt::Cint
    ib_qp_budget::Cint
    enable_shrink::Cint
end

struct epPeerClassInfo_t
    service_level::Cint
    traffic_class::Cint
    adaptive_routing::Cint
end

# What epCommPeerInfo fills (classes: 3 epPeerClassInfo_t, as 9 Cint in a row).
struct epCommPeerInfo_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    peer::Cint
    node::Cint
    path::epPathKind_t
    via_rank::Cint
    transport::NTuple{32,UInt8}
    device::NTuple{64,UInt8}
    port::Cint
    qps::Cint
    link::NTuple{32,UInt8}
    classes::NTuple{9,Cint}
    detail::NTuple{128,UInt8}
end

struct epLayoutArgs_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    topk_idx::Ptr{Cvoid}
    topk_idx_type::epDataType_t
    num_tokens::Cint
    num_topk::Cint
    tokens_per_rank::Ptr{Cint}
    tokens_per_node::Ptr{Cint}
    tokens_per_expert::Ptr{Cint}
    is_token_in_rank::Ptr{UInt8}
end

struct epDispatchArgs_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    flags::Cuint
    x::Ptr{Cvoid}
    x_type::epDataType_t
    x_stride::Csize_t
    x_scales::Ptr{Float32}
    scales_token_stride::Csize_t
    scales_block_stride::Csize_t
    topk_idx::Ptr{Cvoid}
    topk_idx_type::epDataType_t
    topk_weights::Ptr{Float32}
    num_tokens::Cint
    num_topk::Cint
    expert_alignment::Cint
    recv_x::Ptr{Cvoid}
    recv_scales::Ptr{Float32}
    recv_topk_idx::Ptr{Int64}
    recv_topk_weights::Ptr{Float32}
    recv_capacity::Int64
    recv_tokens_per_expert::Ptr{Cint}
    num_recv::Ptr{Int64}
end

struct epCombineArgs_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    flags::Cuint
    y::Ptr{Cvoid}
    y_type::epDataType_t
    y_stride::Csize_t
    recv_topk_weights::Ptr{Float32}
    num_topk::Cint
    bias::Ptr{Cvoid}
    out::Ptr{Cvoid}
    out_topk_weights::Ptr{Float32}
end

struct epLowLatencyDispatchArgs_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    flags::Cuint
    x::Ptr{Cvoid}
    topk_idx::Ptr{Cvoid}
    topk_idx_type::epDataType_t
    topk_weights::Ptr{Float32}
    num_tokens::Cint
    num_topk::Cint
    wire_type::epDataType_t
    recv_x::Ptr{Cvoid}
    recv_scales::Ptr{Float32}
    recv_count::Ptr{Cint}
    recv_src::Ptr{Cint}
end

struct epLowLatencyCombineArgs_t
    size::Csize_t
    magic::Cuint
    version::Cuint
    flags::Cuint
    y::Ptr{Cvoid}
    out::Ptr{Cvoid}
end

# Keyword constructors: every field at its *_INITIALIZER value unless given.
function _initialized(::Type{T}, magic, defaults, kw) where {T}
    vals = Dict{Symbol,Any}(:size => sizeof(T), :magic => magic, :version => Cuint(_version(T)))
    merge!(vals, defaults, Dict(kw))
    for k in keys(kw)
        k in fieldnames(T) || throw(ArgumentError("$(T) has no field $(k)"))
    end
    T((haskey(vals, f) ? convert(fieldtype(T, f), vals[f]) : _zero(fieldtype(T, f)) for f in fieldnames(T))...)
end
_version(::Type{epConfig_t}) = EP_CONFIG_VERSION
_version(::Type) = 1
_zero(::Type{T}) where {T<:Ptr} = T(C_NULL)
_zero(::Type{T}) where {T<:Number} = zero(T)

const _IB = (:ib_sl_throughput, :ib_sl_low_latency, :ib_sl_control, :ib_traffic_class, :ib_gid_index,
             :ib_qps_per_peer, :ib_ar_throughput, :ib_ar_low_latency, :ib_ar_control,
             :ib_tc_throughput, :ib_tc_low_latency, :ib_tc_control, :ib_timeout, :ib_retry_cnt, :ib_qp_budget)
epConfig_t(; kw...) = _initialized(epConfig_t, EP_CONFIG_MAGIC,
                                   Dict{Symbol,Any}(:device => -1, (f => -1 for f in _IB)...), kw)
epLayoutArgs_t(; kw...) = _initialized(epLayoutArgs_t, EP_LAYOUT_ARGS_MAGIC, Dict{Symbol,Any}(:topk_idx_type => epInt64), kw)
epDispatchArgs_t(; kw...) = _initialized(epDispatchArgs_t, EP_DISPATCH_ARGS_MAGIC,
                                         Dict{Symbol,Any}(:topk_idx_type => epInt64), kw)
epCombineArgs_t(; kw...) = _initialized(epCombineArgs_t, EP_COMBINE_ARGS_MAGIC, Dict{Symbol,Any}(), kw)
epLowLatencyDispatchArgs_t(; kw...) = _initialized(epLowLatencyDispatchArgs_t, EP_LL_DISPATCH_ARGS_MAGIC,
                                                   Dict{Symbol,Any}(:topk_idx_type => epInt64,
                                                                    :wire_type => epFloat8E4M3), kw)
epLowLatencyCombineArgs_t(; kw...) = _initialized(epLowLatencyCombineArgs_t, EP_LL_COMBINE_ARGS_MAGIC,
                                                  Dict{Symbol,Any}(), kw)

end # module
