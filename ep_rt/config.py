"""Config (DeepEP-compatible, validated, frozen), its rows by rank count and node size, and the size hints.

ep_rt's intranode kernels write every token straight to its final row (no ring buffer), so of the
five fields only num_sms changes what they do: one block per channel, num_sms channels. The chunk
sizes are kept, validated exactly as DeepEP does, so code that builds Configs keeps working.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import config_tables, deepep_hints
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

    def get_nvl_buffer_size_hint(
        self,
        hidden_bytes: int,
        num_ranks: int,
        num_max_tokens_per_rank: int | None = None,
        num_ranks_per_node: int | None = None,
    ) -> int:
        """Bytes of NVL buffer for high-throughput calls of `hidden_bytes` per token (FP8 scales and top-k up to 32
        included), the ranks in nodes of `num_ranks_per_node` (without it: ranks_per_node's rule: EP_RT_RANKS_PER_NODE,
        torchrun's LOCAL_WORLD_SIZE where it fits, one node up to 8 ranks, DeepEP's 8 where it divides num_ranks, else
        4, 2 or 1).

        DeepEP's two arguments: no more than DeepEP V1's formula gives for this Config (for nodes of 8, exactly its
        hint, or ep_rt's one-pass size where that is smaller). A call whose rows do not fit goes through the buffer in
        rounds; README "Buffer sizes against DeepEP's" says which calls take one pass. With `num_max_tokens_per_rank`
        (ep_rt's own argument): room for a whole call of that many tokens per rank in one pass, whatever the routing
        (every row a rank can receive; across nodes, the combine input of every rank's every token to one rank)."""
        T = ONE_PASS_TOKENS if num_max_tokens_per_rank is None else num_max_tokens_per_rank
        _check_hint_args(hidden_bytes, num_ranks, T)
        G = ranks_per_node(num_ranks, num_ranks_per_node)
        if G < num_ranks:
            _check_nodes(num_ranks, G)
            one_pass = lambda t: internode_layout.nvl_size_hint(hidden_bytes, num_ranks, G, t)  # noqa: E731
        else:
            one_pass = lambda t: nvl_layout.nvl_bytes_for(hidden_bytes, num_ranks * t)  # noqa: E731
        if num_max_tokens_per_rank is not None:
            return one_pass(T)
        deepep = deepep_hints.nvl_bytes(
            self.num_sms, self.num_max_nvl_chunked_recv_tokens, hidden_bytes, G, num_ranks // G
        )
        # Never below one round (a token from each rank), or the hint would size a Buffer that refuses every call.
        return max(min(one_pass(T), deepep), one_pass(1))

    def get_rdma_buffer_size_hint(
        self,
        hidden_bytes: int,
        num_ranks: int,
        num_max_tokens_per_rank: int | None = None,
        num_ranks_per_node: int | None = None,
    ) -> int:
        """Bytes of RDMA (symmetric) buffer for internode high-throughput calls of `hidden_bytes` per token, for
        nodes of `num_ranks_per_node` ranks (the rule of get_nvl_buffer_size_hint); 0 only when all ranks are on one
        node. DeepEP's two arguments: no more than DeepEP V1's formula gives for this Config and node count (calls
        whose streams do not fit go in rounds). With `num_max_tokens_per_rank` (ep_rt's own argument): room for
        whole (rank -> node) streams of that many tokens, so any such call takes one pass."""
        T = ONE_PASS_TOKENS if num_max_tokens_per_rank is None else num_max_tokens_per_rank
        _check_hint_args(hidden_bytes, num_ranks, T)
        G = ranks_per_node(num_ranks, num_ranks_per_node)
        if G == num_ranks:
            return 0
        _check_nodes(num_ranks, G)
        one_pass = lambda t: internode_layout.rdma_size_hint(hidden_bytes, num_ranks, G, t)  # noqa: E731
        if num_max_tokens_per_rank is not None:
            return one_pass(T)
        deepep = deepep_hints.rdma_bytes(
            self.num_sms,
            self.num_max_rdma_chunked_send_tokens,
            self.num_max_rdma_chunked_recv_tokens,
            hidden_bytes,
            num_ranks // G,
        )
        return max(min(one_pass(T), deepep), one_pass(1))


ONE_PASS_TOKENS = 4096  # the two-argument hints never exceed a one-pass call of this many tokens per rank


def ranks_per_node(num_ranks: int, num_ranks_per_node: int | None = None) -> int:
    """The ranks per node (G) that the configs and size hints assume for a group of `num_ranks` ranks.

    A Buffer passes its own (Topology.node_size). Without one, the first of these that applies:
      1. `num_ranks_per_node`, the caller's (1..8);
      2. EP_RT_RANKS_PER_NODE, which the Buffer's Topology will use too;
    either is what the nodes are: one that does not divide num_ranks (or exceeds 8) is a ValueError naming it, since
    a Buffer of that group would refuse it as well. Else G is guessed, never an error:
      3. LOCAL_WORLD_SIZE (torchrun's: the processes it started on this host), where it is at most 8 and the group
         lies in one host or is whole hosts (the whole world, say);
      4. else one node if the group fits in one (at most 8 ranks, and at most LOCAL_WORLD_SIZE where set);
      5. else the largest of 8, 4, 2 and 1 (GPUs per host; DeepEP's 8 first) that divides num_ranks, and no more
         than LOCAL_WORLD_SIZE where set: a subgroup has at most that many ranks on a host. 12 ranks: 3 nodes of 4.
    torch.distributed knows no local world size without a collective, which a static call made on one rank alone
    cannot risk. A group no larger than G lies on one node (G becomes num_ranks)."""
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks <= 0:
        raise ValueError(f"num_ranks must be a positive int, got {num_ranks!r}")
    stated = _stated_node_size(num_ranks_per_node)
    if stated is not None:
        value, source = stated
        G = min(value, num_ranks)
        fix = "" if num_ranks_per_node is not None else " (a Buffer's Topology refuses it too)"
        if G > nvl_layout.MAX_NVL_RANKS:
            raise ValueError(
                f"{num_ranks} ranks in nodes of {G} ({source}), but an ep_rt node holds at most "
                f"{nvl_layout.MAX_NVL_RANKS} ranks (its NVL buffer){fix}"
            )
        if num_ranks % G:
            raise ValueError(f"num_ranks ({num_ranks}) must be a multiple of the ranks per node ({G}: {source}){fix}")
        return G
    lws = _local_world_size()
    if lws is not None and lws <= nvl_layout.MAX_NVL_RANKS and (num_ranks <= lws or num_ranks % lws == 0):
        return min(lws, num_ranks)
    cap = min(lws or config_tables.NVL_PEERS, nvl_layout.MAX_NVL_RANKS)
    if num_ranks <= cap:
        return num_ranks
    return max(g for g in HOST_SIZES if g <= cap and num_ranks % g == 0)


HOST_SIZES = (8, 4, 2, 1)  # GPUs per host that ranks_per_node's guess picks from (1 divides anything)


def _stated_node_size(num_ranks_per_node: int | None) -> tuple[int, str] | None:
    """(G, where it came from) when the caller or EP_RT_RANKS_PER_NODE says what the nodes are, else None."""
    from . import env

    if num_ranks_per_node is not None:
        v = num_ranks_per_node
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= nvl_layout.MAX_NVL_RANKS:
            raise ValueError(f"num_ranks_per_node must be an int in 1..{nvl_layout.MAX_NVL_RANKS}, got {v!r}")
        return v, f"num_ranks_per_node={v}"
    g = env.ranks_per_node()
    if g is not None:
        if g > nvl_layout.MAX_NVL_RANKS:
            raise ValueError(
                f"EP_RT_RANKS_PER_NODE={g}, but an ep_rt node holds at most {nvl_layout.MAX_NVL_RANKS} "
                f"ranks (its NVL buffer)"
            )
        return g, f"EP_RT_RANKS_PER_NODE={g}"
    return None


def _local_world_size() -> int | None:
    # Not an ep_rt knob: torchrun's (and torch.distributed.elastic's) count of this host's processes.
    raw = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not raw:
        return None
    try:
        lws = int(raw)
    except ValueError:
        lws = 0
    if lws <= 0:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive int (torchrun sets it), got {raw!r}")
    return lws


def _check_hint_args(hidden_bytes: int, num_ranks: int, num_max_tokens_per_rank: int) -> None:
    _positive_ints(hidden_bytes=hidden_bytes, num_ranks=num_ranks, num_max_tokens_per_rank=num_max_tokens_per_rank)
    if hidden_bytes % 16:
        raise ValueError(f"hidden_bytes must be a positive multiple of 16, got {hidden_bytes}")


def _check_nodes(num_ranks: int, G: int) -> None:
    """The internode kernels' limits (InternodeOp refuses a Buffer beyond them): a hint for such a group would
    size a Buffer that cannot exist."""
    N = num_ranks // G
    if num_ranks > internode_layout.MAX_RANKS or N > internode_layout.MAX_NODES:
        raise ValueError(
            f"ep_rt's internode kernels serve at most {internode_layout.MAX_RANKS} ranks and "
            f"{internode_layout.MAX_NODES} nodes; {num_ranks} ranks in nodes of {G} are {N} nodes"
        )


def _positive_ints(**values) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def table_config(kind: str, num_ranks: int, num_sms: int, num_ranks_per_node: int | None = None) -> Config:
    """The Config of config_tables for `kind` ("dispatch" / "combine") and `num_ranks` ranks in nodes of
    `num_ranks_per_node` (ranks_per_node's rule without it): DeepEP's row where it has one, the default otherwise."""
    key = (kind, num_ranks, num_sms, num_ranks_per_node)
    # With the node size given nothing here reads the environment, so the Config (frozen) is built once per key:
    # dispatch(config=None) resolves through this on every call. Exact ints only (True == 1 must not hit 1's entry).
    cacheable = num_ranks_per_node is not None and all(type(v) is int for v in key[1:])
    config = _TABLE_CONFIGS.get(key) if cacheable else None
    if config is None:
        G = ranks_per_node(num_ranks, num_ranks_per_node)
        row = config_tables.lookup(kind, num_ranks, num_nodes=num_ranks // G)
        config = Config(num_sms, row.nvl_send, row.nvl_recv, row.rdma_send, row.rdma_recv)
        if cacheable:
            if len(_TABLE_CONFIGS) >= 256:
                _TABLE_CONFIGS.clear()
            _TABLE_CONFIGS[key] = config
    return config


_TABLE_CONFIGS: dict = {}  # table_config's results for an explicit node size
