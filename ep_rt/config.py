"""Config (DeepEP-compatible, validated, frozen) and the tuned tables for 2, 4 and 8 ranks.

ep_rt's intranode kernels write every token straight to its final row (no ring buffer), so of the
five fields only num_sms changes what they do: one block per channel, num_sms channels. The chunk
sizes are kept, validated exactly as DeepEP does, so code that builds Configs keeps working.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import config_tables
from .transport import internode_layout, nvl_layout


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

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int, num_max_tokens_per_rank: int = 4096,
                                 num_ranks_per_node: int | None = None) -> int:
        """Bytes of NVL buffer that hold a dispatch and combine of `num_max_tokens_per_rank` tokens per rank
        with `hidden_bytes` per token (FP8 scales and top-k up to 32 included). Unlike DeepEP's ring buffers,
        ep_rt stages whole calls, so the hint depends on the token count (an extra, optional argument). Across
        nodes (num_ranks > num_ranks_per_node: default EP_RT_RANKS_PER_NODE, else 8, as DeepEP) it is the room for
        the combine input of the worst case (every token of every rank to one rank)."""
        _positive_ints(hidden_bytes=hidden_bytes, num_ranks=num_ranks, num_max_tokens_per_rank=num_max_tokens_per_rank)
        if hidden_bytes % 16:
            raise ValueError(f"hidden_bytes must be a positive multiple of 16, got {hidden_bytes}")
        G = _ranks_per_node(num_ranks_per_node)
        if num_ranks > G:
            _check_nodes(num_ranks, G)
            return internode_layout.nvl_size_hint(hidden_bytes, num_ranks, G, num_max_tokens_per_rank)
        return nvl_layout.nvl_bytes_for(hidden_bytes, num_ranks * num_max_tokens_per_rank)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int, num_max_tokens_per_rank: int = 4096,
                                  num_ranks_per_node: int | None = None) -> int:
        """Bytes of RDMA (symmetric) buffer for internode dispatches of up to num_max_tokens_per_rank tokens per
        rank with hidden_bytes per token (and their combines); 0 when all ranks fit one node. ep_rt's areas hold
        whole (rank -> node) streams, so the hint depends on the token count (an extra, optional argument)."""
        _positive_ints(hidden_bytes=hidden_bytes, num_ranks=num_ranks, num_max_tokens_per_rank=num_max_tokens_per_rank)
        if hidden_bytes % 16:
            raise ValueError(f"hidden_bytes must be a positive multiple of 16, got {hidden_bytes}")
        G = _ranks_per_node(num_ranks_per_node)
        if num_ranks <= G:
            return 0
        _check_nodes(num_ranks, G)
        return internode_layout.rdma_size_hint(hidden_bytes, num_ranks, G, num_max_tokens_per_rank)


def _ranks_per_node(value: int | None) -> int:
    if value is None:
        from . import env

        value = env.ranks_per_node() or nvl_layout.MAX_NVL_RANKS
    if not isinstance(value, int) or not 1 <= value <= nvl_layout.MAX_NVL_RANKS:
        raise ValueError(f"num_ranks_per_node must be an int in 1..{nvl_layout.MAX_NVL_RANKS}, got {value!r}")
    return value


def _check_nodes(num_ranks: int, G: int) -> None:
    if num_ranks % G:
        raise ValueError(f"num_ranks ({num_ranks}) must be a multiple of the ranks per node ({G})")
    if num_ranks > internode_layout.MAX_RANKS:
        raise ValueError(f"ep_rt's internode kernels serve at most {internode_layout.MAX_RANKS} ranks")


def _positive_ints(**values) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def table_config(kind: str, num_ranks: int, num_sms: int) -> Config:
    """The tuned Config of config_tables for `kind` ("dispatch" / "combine") and a rank count."""
    row = config_tables.lookup(kind, num_ranks)
    return Config(num_sms, row.nvl_send, row.nvl_recv, row.rdma_send, row.rdma_recv)
