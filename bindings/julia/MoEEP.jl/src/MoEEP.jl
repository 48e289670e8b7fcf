"""
    MoEEP

libmoeep from Julia over `ccall`: expert-parallel dispatch and combine. The
same surface as the Rust crate: `Comm` and `Handle` (released by `close`,
or by their finalizers), calls that throw `MoEEPError` with the library's
message, and calls on host arrays for the host backend.

Julia arrays are column-major: a C `[T, H]` row-major matrix is a Julia
`H x T` matrix (a column per token); `topk_idx` is `K x T`.
"""
module MoEEP

include("LibMoEEP.jl")
using .LibMoEEP
const L = LibMoEEP

export Comm, Handle, UniqueId, MoEEPError, BF16, init_rank, init_all, dispatch, dispatch_cached, combine,
       ll_dispatch, ll_combine, local_experts, version

"A failed call: the `epResult_t` and the library's message."
struct MoEEPError <: Exception
    code::Cint
    message::String
end
Base.showerror(io::IO, e::MoEEPError) = print(io, "MoEEPError(", e.code, "): ", e.message)

function check(res::Cint, comm::Ptr{Cvoid}=C_NULL)
    res == L.epSuccess && return nothing
    msg = unsafe_string(ccall((:epGetLastError, L.libmoeep), Cstring, (Ptr{Cvoid},), comm))
    throw(MoEEPError(res, msg))
end

"BF16 bits; `BF16(x::Float32)` rounds to nearest even, `Float32(b)` is exact."
struct BF16
    bits::UInt16
end
function BF16(x::Float32)
    u = reinterpret(UInt32, x)
    isnan(x) && return BF16(UInt16(u >> 16) | 0x0040)
    BF16(UInt16((u + 0x00007fff + ((u >> 16) & 0x1)) >> 16))
end
Base.Float32(b::BF16) = reinterpret(Float32, UInt32(b.bits) << 16)

_type(::Type{BF16}) = L.epBfloat16
_type(::Type{Float32}) = L.epFloat32
_type(::Type{UInt8}) = L.epFloat8E4M3   # FP8-E4M3 bytes

function version()
    v = Ref{Cint}(0)
    check(ccall((:epGetVersion, L.libmoeep), Cint, (Ptr{Cint},), v))
    (div(v[], 10000), div(v[], 100) % 100, v[] % 100)
end

"The 128 bytes every rank is given; `UniqueId()` calls `epGetUniqueId` (the root rank, or any with EP_COMM_ID)."
struct UniqueId
    id::L.epUniqueId
end
function UniqueId()
    r = Ref(L.epUniqueId(ntuple(_ -> 0x00, 128)))
    check(ccall((:epGetUniqueId, L.libmoeep), Cint, (Ptr{L.epUniqueId},), r))
    UniqueId(r[])
end
UniqueId(bytes::AbstractVector{UInt8}) = UniqueId(L.epUniqueId(NTuple{128,UInt8}(bytes)))
Base.Vector{UInt8}(u::UniqueId) = collect(u.id.internal)

"A communicator (`epComm_t`); `close(comm)` destroys it, else its finalizer does."
mutable struct Comm
    ptr::Ptr{Cvoid}
    cfg::L.epConfig_t
    rank::Int
    size::Int
    first_expert::Int
    local_experts::Int
    function Comm(ptr, cfg)
        r, s, f, c = Ref{Cint}(0), Ref{Cint}(0), Ref{Cint}(0), Ref{Cint}(0)
        check(ccall((:epCommRank, L.libmoeep), Cint, (Ptr{Cvoid}, Ptr{Cint}), ptr, r), ptr)
        check(ccall((:epCommSize, L.libmoeep), Cint, (Ptr{Cvoid}, Ptr{Cint}), ptr, s), ptr)
        check(ccall((:epCommLocalExperts, L.libmoeep), Cint, (Ptr{Cvoid}, Ptr{Cint}, Ptr{Cint}), ptr, f, c), ptr)
        comm = new(ptr, cfg, r[], s[], f[], c[])
        finalizer(close, comm)
    end
end

function Base.close(c::Comm)
    if c.ptr != C_NULL
        ptr, c.ptr = c.ptr, C_NULL
        ccall((:epCommDestroy, L.libmoeep), Cint, (Ptr{Cvoid},), ptr)
    end
    nothing
end
live(c::Comm) = c.ptr == C_NULL ? throw(ArgumentError("the communicator is closed")) : c.ptr
local_experts(c::Comm) = (c.first_expert, c.local_experts)

"""
    config(; num_experts, hidden, max_tokens_per_rank, max_topk, backend=:host, kw...)

An `epConfig_t`; other fields by their header names (`dispatch_type`,
`timeout_ms`, `low_latency`, ...).
"""
function config(; backend::Symbol=:host, kw...)
    b = Dict(:auto => L.epBackendAuto, :host => L.epBackendHost, :cuda => L.epBackendCuda)[backend]
    L.epConfig_t(; backend=b, kw...)
end

"`epCommInitRank`: collective over `nranks` processes or threads."
function init_rank(nranks::Integer, id::UniqueId, rank::Integer; kw...)
    cfg = config(; kw...)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall((:epCommInitRank, L.libmoeep), Cint, (Ptr{Ptr{Cvoid}}, Cint, L.epUniqueId, Cint, Ref{L.epConfig_t}),
                p, nranks, id.id, rank, cfg))
    Comm(p[], cfg)
end

"`epCommInitAll`: all ranks in this process (host backend: call each rank from its own thread)."
function init_all(nranks::Integer; kw...)
    cfg = config(; kw...)
    ptrs = fill(C_NULL, nranks)
    check(ccall((:epCommInitAll, L.libmoeep), Cint, (Ptr{Ptr{Cvoid}}, Cint, Ptr{Cint}, Ref{L.epConfig_t}),
                ptrs, nranks, C_NULL, cfg))
    [Comm(p, cfg) for p in ptrs]
end

"A routing handle (`epHandle_t`); `close(h)` destroys it (allowed after its communicator's close)."
mutable struct Handle
    ptr::Ptr{Cvoid}
    num_tokens::Int
    num_topk::Int
    function Handle(ptr, t, k)
        h = new(ptr, t, k)
        finalizer(close, h)
    end
end

function Base.close(h::Handle)
    if h.ptr != C_NULL
        ptr, h.ptr = h.ptr, C_NULL
        ccall((:epHandleDestroy, L.libmoeep), Cint, (Ptr{Cvoid},), ptr)
    end
    nothing
end

function num_recv(h::Handle)
    n = Ref{Int64}(-1)
    res = ccall((:epHandleRecvCount, L.libmoeep), Cint, (Ptr{Cvoid}, Ptr{Int64}), h.ptr, n)
    res == L.epSuccess ? Int(n[]) : nothing
end

host_only(c::Comm) = c.cfg.backend == L.epBackendHost ||
    throw(ArgumentError("calls on arrays serve a communicator on the host backend (backend=:host)"))
_ptr(a) = a === nothing || isempty(a) ? C_NULL : pointer(a)

"""
    dispatch(comm, x, topk_idx; topk_weights=nothing, scales=nothing, expert_alignment=0)

A new routing: `x` is `hidden x T` (BF16, Float32 or FP8 bytes as the
config's dispatch type), `topk_idx` `K x T` Int64. Prepares (exact row
count), then dispatches. Returns `(handle, (x, scales, topk_idx,
topk_weights, tokens_per_expert))`, rows by source rank then token.
"""
function dispatch(c::Comm, x::Matrix{T}, topk_idx::Matrix{Int64}; topk_weights=nothing, scales=nothing,
                  expert_alignment::Integer=0) where {T}
    host_only(c)
    H, n = size(x)
    K = size(topk_idx, 1)
    H == c.cfg.hidden || throw(ArgumentError("x has $H rows per token, hidden is $(c.cfg.hidden)"))
    size(topk_idx, 2) == n || throw(ArgumentError("topk_idx has $(size(topk_idx, 2)) tokens, x has $n"))
    args(; kw...) = L.epDispatchArgs_t(; x=_ptr(x), x_type=_type(T), x_scales=_ptr(scales), topk_idx=_ptr(topk_idx),
                                       topk_weights=_ptr(topk_weights), num_tokens=n, num_topk=K,
                                       expert_alignment=expert_alignment, kw...)
    hp = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve x topk_idx topk_weights scales begin
        check(ccall((:epDispatchPrepare, L.libmoeep), Cint,
                    (Ptr{Cvoid}, Ref{L.epDispatchArgs_t}, Ptr{Ptr{Cvoid}}, Ptr{Cvoid}), live(c), args(), hp, C_NULL),
              c.ptr)
        h = Handle(hp[], n, K)
        rows = num_recv(h)
        nb = cld(H, 128)
        out = (x=Matrix{T}(undef, H, rows), scales=scales === nothing ? Float32[] : Matrix{Float32}(undef, nb, rows),
               topk_idx=Matrix{Int64}(undef, K, rows),
               topk_weights=topk_weights === nothing ? Float32[] : Matrix{Float32}(undef, K, rows),
               tokens_per_expert=Vector{Cint}(undef, c.local_experts))
        count = Ref{Int64}(-1)
        GC.@preserve out count begin
            a = args(recv_x=_ptr(out.x), recv_scales=_ptr(out.scales), recv_topk_idx=_ptr(out.topk_idx),
                     recv_topk_weights=_ptr(out.topk_weights), recv_capacity=rows,
                     recv_tokens_per_expert=_ptr(out.tokens_per_expert),
                     num_recv=Base.unsafe_convert(Ptr{Int64}, count))
            check(ccall((:epDispatch, L.libmoeep), Cint,
                        (Ptr{Cvoid}, Ref{L.epDispatchArgs_t}, Ptr{Ptr{Cvoid}}, Ptr{Cvoid}), c.ptr, a, hp, C_NULL),
                  c.ptr)
        end
    end
    return h, out
end

"A cached re-dispatch of new rows `x` (`hidden x T`) with the routing of `h`."
function dispatch_cached(c::Comm, h::Handle, x::Matrix{T}; scales=nothing) where {T}
    host_only(c)
    H, n = size(x)
    n == h.num_tokens || throw(ArgumentError("x has $n tokens, the handle's dispatch had $(h.num_tokens)"))
    rows = num_recv(h)
    recv = Matrix{T}(undef, H, rows)
    recv_scales = scales === nothing ? Float32[] : Matrix{Float32}(undef, cld(H, 128), rows)
    hp = Ref{Ptr{Cvoid}}(h.ptr)
    GC.@preserve x scales recv recv_scales begin
        a = L.epDispatchArgs_t(; x=_ptr(x), x_type=_type(T), x_scales=_ptr(scales), num_tokens=n,
                               recv_x=_ptr(recv), recv_scales=_ptr(recv_scales), recv_capacity=rows)
        check(ccall((:epDispatch, L.libmoeep), Cint, (Ptr{Cvoid}, Ref{L.epDispatchArgs_t}, Ptr{Ptr{Cvoid}}, Ptr{Cvoid}),
                    live(c), a, hp, C_NULL), c.ptr)
    end
    recv
end

"""
    combine(comm, h, y; bias=nothing, recv_topk_weights=nothing)

`y` (`hidden x num_recv`, one column per received token) summed onto the
tokens' home ranks: returns `(out, out_topk_weights)`, `out` `hidden x T`.
"""
function combine(c::Comm, h::Handle, y::Matrix{T}; bias=nothing, recv_topk_weights=nothing) where {T}
    host_only(c)
    H = size(y, 1)
    out = Matrix{T}(undef, H, h.num_tokens)
    K = recv_topk_weights === nothing ? 0 : size(recv_topk_weights, 1)
    out_w = K == 0 ? Float32[] : Matrix{Float32}(undef, K, h.num_tokens)
    GC.@preserve y bias recv_topk_weights out out_w begin
        a = L.epCombineArgs_t(; y=_ptr(y), y_type=_type(T), recv_topk_weights=_ptr(recv_topk_weights), num_topk=K,
                              bias=_ptr(bias), out=_ptr(out), out_topk_weights=_ptr(out_w))
        check(ccall((:epCombine, L.libmoeep), Cint, (Ptr{Cvoid}, Ref{L.epCombineArgs_t}, Ptr{Cvoid}, Ptr{Cvoid}),
                    live(c), a, h.ptr, C_NULL), c.ptr)
    end
    out, out_w
end

"""
    ll_dispatch(comm, x, topk_idx; topk_weights=nothing, wire=:fp8)

Low-latency dispatch (config `low_latency=1`) of `x` (`hidden x T` BF16).
Returns `(handle, (x, scales, count, src))` in the header's expert-major
layout, column-major here: `x` is `hidden x (R*M) x experts`, `scales`
`(R*M) x ceil(hidden/128) x experts`.
"""
function ll_dispatch(c::Comm, x::Matrix{BF16}, topk_idx::Matrix{Int64}; topk_weights=nothing, wire::Symbol=:fp8)
    host_only(c)
    H, n = size(x)
    K = size(topk_idx, 1)
    slots, E = c.size * c.cfg.max_tokens_per_rank, c.local_experts
    fp8 = wire == :fp8
    out = (x=fp8 ? Array{UInt8}(undef, H, slots, E) : Array{BF16}(undef, H, slots, E),
           scales=fp8 ? Array{Float32}(undef, slots, cld(H, 128), E) : Float32[],
           count=Vector{Cint}(undef, E), src=Matrix{Cint}(undef, slots, E))
    hp = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve x topk_idx topk_weights out begin
        a = L.epLowLatencyDispatchArgs_t(; x=_ptr(x), topk_idx=_ptr(topk_idx), topk_weights=_ptr(topk_weights),
                                         num_tokens=n, num_topk=K, wire_type=fp8 ? L.epFloat8E4M3 : L.epBfloat16,
                                         recv_x=_ptr(out.x), recv_scales=_ptr(out.scales), recv_count=_ptr(out.count),
                                         recv_src=_ptr(out.src))
        check(ccall((:epLowLatencyDispatch, L.libmoeep), Cint,
                    (Ptr{Cvoid}, Ref{L.epLowLatencyDispatchArgs_t}, Ptr{Ptr{Cvoid}}, Ptr{Cvoid}), live(c), a, hp, C_NULL),
              c.ptr)
    end
    Handle(hp[], n, K), out
end

"Low-latency combine of `y` (`hidden x (R*M) x experts` BF16); returns `hidden x T` BF16."
function ll_combine(c::Comm, h::Handle, y::Array{BF16,3})
    host_only(c)
    out = Matrix{BF16}(undef, size(y, 1), h.num_tokens)
    GC.@preserve y out begin
        a = L.epLowLatencyCombineArgs_t(; y=_ptr(y), out=_ptr(out))
        check(ccall((:epLowLatencyCombine, L.libmoeep), Cint,
                    (Ptr{Cvoid}, Ref{L.epLowLatencyCombineArgs_t}, Ptr{Cvoid}, Ptr{Cvoid}), live(c), a, h.ptr, C_NULL),
              c.ptr)
    end
    out
end

end # module
