"""Config (DeepEP-compatible, validated, frozen) and the tuned tables for 2, 4 and 8 ranks.

ep_rt's intranode kernels write every token straight to its final row (no ring buffer), so of the
five fields only num_sms changes what they do: one block per channel, num_sms channels. The chunk
sizes are kept, validated exactly as DeepEP does, so code that builds Configs keeps working.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import config_tables
from .transport import nvl_layout


@dataclass(frozen=True)
class Config:
    num_sms: int = 20
    num_max_nvl_chunked_send_tokens: int = 6
    num_max_nvl_chunked_recv_tokens: int = 256
    num_max_rdma_chunked_send_tokens: int = 6
    num_max_rdma_chunked_recv_tokens: int = 256

    def __post_init__(self):
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Config.{name} must be an int, got {value!r}")
        if not 0 < self.num_sms <= nvl_layout.MAX_CHANNELS:
            raise ValueError(f"Config.num_sms must be in 1..{nvl_layout.MAX_CHANNELS}, got {self.num_sms}")
        if self.num_max_nvl_chunked_send_tokens <= 0 or self.num_max_nvl_chunked_recv_tokens <= 0:
            raise ValueError("Config: NVL chunk sizes must be positive")
        if self.num_max_nvl_chunked_send_tokens >= self.num_max_nvl_chunked_recv_tokens:
            raise ValueError("Config: num_max_nvl_chunked_send_tokens must be < num_max_nvl_chunked_recv_tokens")
        send, recv = self.num_max_rdma_chunked_send_tokens, self.num_max_rdma_chunked_recv_tokens
        if send <= 0 or recv <= 0:
            raise ValueError("Config: RDMA chunk sizes must be positive")
        # DeepEP rounds the RDMA receive size up to a multiple of the send size.
        recv = (recv + send - 1) // send * send
        object.__setattr__(self, "num_max_rdma_chunked_recv_tokens", recv)
        if not send <= recv // 2:
            raise ValueError("Config: num_max_rdma_chunked_send_tokens must be <= half the receive size")

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int, num_max_tokens_per_rank: int = 4096) -> int:
        """Bytes of NVL buffer that hold a dispatch and combine of `num_max_tokens_per_rank` tokens per rank
        with `hidden_bytes` per token (FP8 scales and top-k up to 32 included). Unlike DeepEP's ring buffers,
        ep_rt stages whole calls, so the hint depends on the token count (an extra, optional argument)."""
        _positive_ints(hidden_bytes=hidden_bytes, num_ranks=num_ranks, num_max_tokens_per_rank=num_max_tokens_per_rank)
        if hidden_bytes % 16:
            raise ValueError(f"hidden_bytes must be a positive multiple of 16, got {hidden_bytes}")
        if num_ranks > nvl_layout.MAX_NVL_RANKS:
            raise ValueError(f"intranode buffers serve 1..{nvl_layout.MAX_NVL_RANKS} ranks, got {num_ranks}")
        return nvl_layout.nvl_bytes_for(hidden_bytes, num_ranks * num_max_tokens_per_rank)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        _positive_ints(hidden_bytes=hidden_bytes, num_ranks=num_ranks)
        if num_ranks <= nvl_layout.MAX_NVL_RANKS:
            return 0
        raise NotImplementedError("ep_rt has no internode high-throughput kernels yet (more than 8 ranks)")


def _positive_ints(**values) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def table_config(kind: str, num_ranks: int, num_sms: int) -> Config:
    """The tuned Config of config_tables for `kind` ("dispatch" / "combine") and a rank count."""
    row = config_tables.lookup(kind, num_ranks)
    return Config(num_sms, row.nvl_send, row.nvl_recv, row.rdma_send, row.rdma_recv)
