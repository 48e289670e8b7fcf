"""get_dispatch_layout in torch operations on the current stream: deterministic,
no host wait, capturable. A token counts once per rank however many of its
experts live there; (token, expert) pairs count per expert; -1 is no expert.
Experts are placed in contiguous blocks of num_experts / ranks, as in libmoeep."""

RANKS_PER_RDMA_NODE = 8  # DeepEP's node: 8 ranks (the count of num_tokens_per_rdma_rank)


def dispatch_layout(topk_idx, num_experts, num_ranks):
    import torch
    if num_experts % num_ranks != 0:
        raise ValueError("get_dispatch_layout: num_experts = %d is not a multiple of the %d ranks" % (
            num_experts, num_ranks))
    T = topk_idx.size(0)
    dev = topk_idx.device
    idx = topk_idx.long()
    valid = idx >= 0
    # Entries of -1 land in an extra column (rank R, expert E), dropped afterwards.
    rank_of = torch.where(valid, torch.div(idx, num_experts // num_ranks, rounding_mode="floor"),
                          torch.full_like(idx, num_ranks))
    in_rank = torch.zeros((T, num_ranks + 1), dtype=torch.bool, device=dev)
    in_rank.scatter_(1, rank_of, True)
    is_token_in_rank = in_rank[:, :num_ranks].contiguous()
    num_tokens_per_rank = is_token_in_rank.sum(0, dtype=torch.int32)
    expert_of = torch.where(valid, idx, torch.full_like(idx, num_experts)).flatten()
    per_expert = torch.zeros((num_experts + 1,), dtype=torch.int32, device=dev)
    per_expert.scatter_add_(0, expert_of, torch.ones_like(expert_of, dtype=torch.int32))
    num_tokens_per_expert = per_expert[:num_experts].contiguous()
    num_tokens_per_rdma_rank = None
    if num_ranks > RANKS_PER_RDMA_NODE:
        nodes = (num_ranks + RANKS_PER_RDMA_NODE - 1) // RANKS_PER_RDMA_NODE
        padded = torch.zeros((T, nodes * RANKS_PER_RDMA_NODE), dtype=torch.bool, device=dev)
        padded[:, :num_ranks] = is_token_in_rank
        num_tokens_per_rdma_rank = padded.view(T, nodes, RANKS_PER_RDMA_NODE).any(2).sum(0, dtype=torch.int32)
    return num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank
