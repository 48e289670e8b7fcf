# Not run: Julia is not packaged for the machines this project is tested on
# (see ../README.md). Two host ranks as threads (julia --threads 2), a dispatch
# and a combine checked against what SPEC.md says they compute.
using MoEEP, Test

const E, H, M, K = 4, 16, 8, 2

@testset "MoEEP" begin
    @test MoEEP.version() == (0, 1, 0)
    comms = init_all(2; num_experts=E, hidden=H, max_tokens_per_rank=M, max_topk=K, backend=:host)
    results = Vector{Any}(undef, 2)
    @sync for r in 1:2
        Threads.@spawn begin
            c = comms[r]
            T = 3
            x = [BF16(Float32(100 * (r - 1) + t)) for _ in 1:H, t in 1:T]
            idx = Int64[(t - 1) % E for _ in 1:K, t in 1:T]
            idx[2, :] .= -1
            h, got = dispatch(c, x, idx)
            out, _ = combine(c, h, got.x)
            results[r] = (got, out, x, idx)
            close(h)
        end
    end
    for r in 1:2
        got, out, x, idx = results[r]
        # Token t (0-based) chooses expert t % 4, on rank (t % 4) ÷ 2: it comes back once.
        @test all(Float32(out[j, t]) == Float32(x[j, t]) for j in 1:H, t in 1:3)
    end
    foreach(close, comms)
    @test_throws MoEEPError init_all(1; num_experts=4, hidden=0, max_tokens_per_rank=8, max_topk=2)
end
