"""DeepEP's performance Config. Only num_sms reaches libmoeep (the SM budget
of the high-throughput kernels); the chunk sizes are kept for code that reads
them back and are otherwise unused (libmoeep chunks on its own)."""


class Config:
    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
                 num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=256):
        if num_sms <= 0:
            raise ValueError("num_sms must be positive, not %d" % num_sms)
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: the Buffer ignores num_nvl_bytes (libmoeep sizes its buffers itself)."""
        return 0

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: the Buffer ignores num_rdma_bytes."""
        return 0

    def __repr__(self):
        return "Config(num_sms=%d)" % self.num_sms
