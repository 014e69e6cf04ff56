"""Internode high-throughput dispatch and combine (kernels_src/internode.cu) across N nodes of G ranks.

Dispatch = notify (counts all-to-all; the host reads the receive counts from mapped memory unless
num_worst_tokens) + send + forward + receive. Cached dispatch = the same three without notify, from the handle,
after a handshake. Combine = publish + forward + reduce. The transports are the Buffer's: the symmetric buffer of
the NVSHMEM session (inter-node traffic only: each rank's is written by the network and read by itself) and the
node's NVL buffer (everything inside a node: relayed notify slots, flags, the records the forwarders push, the
combine input rows).
With num_worst_tokens nothing waits on the host, so dispatch, cached dispatch and combine can be captured in a CUDA
graph: the kernels number their calls in device memory.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from .. import validate
from ..errors import BufferTooSmallError
from ..events import allocating_on
from ..handles import DispatchResult, HandleFacts, InternodeHandle, as_handle, next_serial, with_facts
from ..ht_op import DispatchCall
from ..runtime import abi, driver
from ..runtime.call_plans import copy_struct as _copy, plan_for
from ..runtime.launch import Launcher
from ..transport import internode_layout as lay_mod
from ..transport import net_stats
from ..transport import nvl_layout
from ..transport.device_view import device_tensor
from ..transport.error_record import ErrorRecords
from ..transport.host_wait import wait_for_token
from ..transport.nvl import NvlBuffer
from ..transport.symmetric import SymmetricBuffer
from ..transport.topology import Topology
from . import internode_rounds

SLOT = "internode"
_KERNELS = ("notify", "send", "forward", "recv", "combine_publish", "combine_forward", "combine_reduce", "barrier")
_EARLY = frozenset(("forward", "recv", "combine_forward", "combine_reduce"))
_META_BYTES = 8  # recv_src_meta: source node and mask, int32 each


class _Plan:
    """One call shape's parameter struct, filled once (issue 23, docs/HOST_PATH.md): the op's fixed fields, the
    layout of the symmetric and NVL areas for the shape's record size, and the shape's sizes and flags; with the
    capacities the host checks. A call copies it into its first kernel's struct and patches its tensors' pointers and
    token counts; the kernels after it get that struct (one memmove each), as they take the same fields."""

    __slots__ = ("params", "cap", "record", "records_rows", "combine_cap", "combine_rows", "combine_record")


class InternodeOp:
    """ep_rt.ht_op.HighThroughputOp across nodes. Owns no transports (the Buffer made the symmetric buffer, the NVL
    buffer and the error records); its workspace, scratch and host counters are its own (destroy frees the host
    counters whatever the peers do, so it has no error slot of its own in the Buffer's teardown)."""

    is_internode = True
    # Its kernels reach other nodes only through rail peers and keep node peers to the NVL buffers, so a Buffer
    # without low_latency_mode can join a world of its rail (transport.nvshmem_world).
    supports_rail_world = True
    error_slot = None

    @staticmethod
    def symmetric_bytes(num_rdma_bytes: int, num_ranks: int, num_nodes: int) -> int:
        return lay_mod.control_offsets(num_rdma_bytes, num_ranks, num_nodes)["end"]

    def __init__(
        self,
        topology: Topology,
        sym: SymmetricBuffer,
        nvl: NvlBuffer,
        module,
        num_rdma_bytes: int,
        device_index: int,
        net_timeout_s: float,
        errors: ErrorRecords,
        pe_base: Optional[int] = None,
        pe_stride: Optional[int] = None,
        qp_rule_num_qps: Optional[int] = None,
    ):
        """qp_rule_num_qps: the Buffer's num_qps_per_rank where IBGDA queue pairs carry the calls (DeepEP's rule
        between it and config.num_sms is checked on every dispatch); None: no such rule."""
        R, G = topology.num_ranks, topology.node_size
        N = R // G
        if R > lay_mod.MAX_RANKS or N > lay_mod.MAX_NODES:
            raise NotImplementedError(
                f"ep_rt's internode kernels serve at most {lay_mod.MAX_RANKS} ranks and "
                f"{lay_mod.MAX_NODES} nodes; this group has {R} ranks on {N} nodes"
            )
        self.topology, self.rank, self.num_ranks, self.G, self.N = topology, topology.rank, R, G, N
        self.device = torch.device("cuda", device_index)
        self.nvl = nvl
        self.num_rdma_bytes = num_rdma_bytes
        self.net_timeout_s = net_timeout_s
        self.errors = errors
        self.control = lay_mod.control_offsets(num_rdma_bytes, R, N)
        self.nvl_control = lay_mod.nvl_control_offsets(R, N)
        self.records_bytes = nvl.num_nvl_bytes - self.nvl_control["records"]
        if self.records_bytes <= 0:
            raise BufferTooSmallError(
                f"rank {self.rank}: internode calls keep {self.nvl_control['records']} bytes of control data in the "
                f"NVL buffer ({nvl.num_nvl_bytes} bytes); create the Buffer with num_nvl_bytes above that (see "
                f"Config.get_nvl_buffer_size_hint)"
            )
        # The network reaches my rail peer on node n as PE pe_base + n * pe_stride (a world of all ranks by default:
        # PE = rank). No mapping of any other rank's symmetric buffer is passed to the kernels: only the GPU the NIC
        # wrote into reads those bytes; inside a node everything goes through the NVL buffers.
        self.pe_base = topology.local_rank if pe_base is None else pe_base
        self.pe_stride = G if pe_stride is None else pe_stride
        self.sym_base = sym.ptr
        self.module = module
        # The chaos variant counts its network operations and charges each quiet a sweep (transport.net_stats);
        # the world it sweeps: the rail (pe_stride 1) or every rank.
        self.net_stats = net_stats.charged(module, self.device, N if self.pe_stride == 1 else R)
        self.workspace = torch.zeros(abi.EP_RT_IN_WS_WORDS, dtype=torch.int64, device=self.device)
        self.scratch = torch.zeros(abi.EP_RT_MAX_CHANNELS * (R + N), dtype=torch.int32, device=self.device)
        self.consumed = torch.zeros(
            2 * abi.EP_RT_IN_MAX_NODES * abi.EP_RT_MAX_CHANNELS * abi.EP_RT_IN_STREAM_CHUNKS,
            dtype=torch.int64,
            device=self.device,
        )
        self.host_ptr, host_dev_ptr = driver.host_alloc_mapped(abi.EP_RT_IN_HOST_WORDS * 4)
        self.counters = (ctypes.c_int32 * abi.EP_RT_IN_HOST_WORDS).from_address(self.host_ptr)
        ctypes.memset(self.host_ptr, 0, abi.EP_RT_IN_HOST_WORDS * 4)
        self.host_token = 0
        self.kernels = {name: Launcher(module, f"ep_rt_internode_{name}", abi.InternodeParams) for name in _KERNELS}
        nvl_area = [ptr + nvl_layout.CONTROL_BYTES for ptr in nvl.peer_ptrs]  # the NVL buffer's data region
        for k in self.kernels.values():
            p = k.params
            p.sym_base = self.sym_base
            for i, ptr in enumerate(nvl_area):
                p.nvl_peers[i] = ptr
            lay_mod.fill_nvl(p.nvl, self.nvl_control, nvl.num_nvl_bytes)
            p.pe_base, p.pe_stride = self.pe_base, self.pe_stride
            p.workspace, p.error = self.workspace.data_ptr(), errors.device_ptr(SLOT)
            p.host_counters, p.scratch, p.consumed = host_dev_ptr, self.scratch.data_ptr(), self.consumed.data_ptr()
            p.net_timeout_ns = int(net_timeout_s * 1e9)
            p.rank, p.num_ranks, p.ranks_per_node, p.num_nodes = self.rank, R, G, N
        errors.on_rearm(SLOT, lambda: self.workspace[abi.EP_RT_IN_WS_CLAIM].zero_())
        errors.name_nodes(SLOT, G)
        self.qp_rule_num_qps = qp_rule_num_qps
        self.serial = next_serial()  # the owner its handles name
        self.timer = None  # ep_rt.testing.bench.KernelTimer while benchmarking
        torch.cuda.synchronize(self.device)

    # ---- state ----------------------------------------------------------------------------------
    def raise_if_failed(self) -> None:
        self.errors.raise_if_failed(SLOT)

    @property
    def failed(self):
        return self.errors.check(SLOT)

    def rdma_tensor(self) -> torch.Tensor:
        """The caller's num_rdma_bytes of the symmetric buffer as uint8 (no copy)."""
        return device_tensor(self.sym_base, (self.num_rdma_bytes,), self.device)

    def barrier(self, stream, timeout_s: Optional[float] = None) -> None:
        """All ranks meet (the network deadline, or `timeout_s`); raises CommTimeoutError naming a missing peer. The
        Buffer's first one waits longer: ranks that start NVSHMEM at different times are not a fault."""
        self.raise_if_failed()
        self._layout(("barrier",), 16)
        p = self.kernels["barrier"].params
        p.net_timeout_ns = int((self.net_timeout_s if timeout_s is None else timeout_s) * 1e9)
        try:
            self._launch("barrier", 1, stream)
            stream.synchronize()
        finally:
            p.net_timeout_ns = int(self.net_timeout_s * 1e9)
        self.raise_if_failed()

    def destroy(self, collective: bool) -> None:
        if self.host_ptr:
            driver.host_free(self.host_ptr)
            self.host_ptr, self.counters = 0, None

    def _launch(self, name: str, grid: int, stream, **fields) -> None:
        """Launch one kernel of a call. The forward and receive kernels (dispatch) and the forward and reduce kernels
        (combine) start early (programmatic dependent launches): they wait for the kernel before them through flags
        and signal words only, so the roles of a call overlap (sending, forwarding, copying out). Timed by the
        benchmark, every kernel starts after the one before it."""
        k = self.kernels[name]
        if fields:
            k.set(**fields)
        if self.timer is None:
            k(grid, stream, early=name in _EARLY)
        else:
            self.timer.around(name, stream, lambda: k(grid, stream))

    # Made on first use (an op built with object.__new__, as the CPU tests do, has it too).
    call_plans = None  # (kind, shape...) -> _Plan

    def _plan_for(self, key) -> _Plan:
        return plan_for(self, key, self._build_plan)

    def _build_plan(self, kind, *shape) -> _Plan:
        plan = _Plan()
        if kind == "combine":
            hidden, K, C = shape
            record = lay_mod.combine_record_bytes(hidden, K)
            p = abi.InternodeParams.from_buffer_copy(self.kernels["combine_publish"].params)  # its fixed fields
            p.num_channels, p.hidden_bytes, p.num_topk = C, 2 * hidden, K
        else:
            hidden_bytes, hidden, S, K, E, C, alignment, worst = shape
            record = lay_mod.dispatch_record_bytes(hidden_bytes, S, K)
            p = abi.InternodeParams.from_buffer_copy(self.kernels["notify"].params)
            p.num_channels, p.hidden_bytes, p.num_scales, p.num_topk = C, hidden_bytes, S, K
            p.num_experts, p.expert_alignment, p.cached, p.fill_unused = E, alignment, int(kind == "cached"), int(worst)
            p.recv_topk_idx_bits = 64
            if kind == "cached":
                p.topk_idx = p.topk_weights = p.num_tokens_per_expert = p.host_token = 0
                p.recv_src_meta = p.send_nvl_head = p.recv_topk_idx = p.recv_topk_weights = 0
                p.num_fwd_rows, p.topk_idx_bits = 0, 64
            else:
                plan.combine_record = lay_mod.combine_record_bytes(hidden, K)
                plan.combine_cap = lay_mod.capacity(self.num_rdma_bytes, self.N, plan.combine_record)
                plan.combine_rows = self._nvl_rows(hidden, K)
        plan.cap = lay_mod.fill(p.lay, self.control, self.num_rdma_bytes, self.N, record)
        plan.record, plan.records_rows = record, self.records_bytes // record
        p.nvl_capacity_rows = plan.records_rows
        plan.params = p
        return plan

    def _wait_counters(self, token: int) -> None:
        # (the notify's waits for my node's words have twice the network deadline: see node_timeout_ns)
        wait_for_token(
            self.counters,
            abi.EP_RT_IN_HOST_TOKEN,
            token,
            2 * self.net_timeout_s,
            self.errors,
            SLOT,
            f"rank {self.rank} (node {self.topology.node})",
            "internode dispatch notify",
        )

    def _too_small(self, what: str, need_rows: int, cap: int, record_bytes: int, nvl: bool) -> BufferTooSmallError:
        if nvl:
            need = nvl_layout.align(self.nvl_control["records"] + need_rows * record_bytes)
            return BufferTooSmallError(
                f"rank {self.rank}: this {what} needs {need_rows} rows of {record_bytes} bytes in the NVL buffer of "
                f"some rank but the NVL buffer ({self.nvl.num_nvl_bytes} bytes) holds {cap}; create the Buffer with "
                f"num_nvl_bytes >= {need} (nothing more was launched; the Buffer stays usable)"
            )
        need = lay_mod.rdma_bytes_for(record_bytes, self.N, need_rows)
        return BufferTooSmallError(
            f"rank {self.rank}: this {what} sends up to {need_rows} tokens from one rank to one node but the RDMA "
            f"buffer ({self.num_rdma_bytes} bytes) holds {cap} per node at {record_bytes} bytes a token; create the "
            f"Buffer with num_rdma_bytes >= {need} (nothing more was launched; the Buffer stays usable)"
        )

    def _nvl_rows(self, hidden: int, K: int) -> int:
        """Combine rows of this shape the NVL records region holds."""
        return self.records_bytes // lay_mod.combine_record_bytes(hidden, K)

    def _layout(self, names, record_bytes: int, nvl_row_bytes: Optional[int] = None) -> int:
        """Fill the call's layout into the kernels `names` (record size known; NVL rows of nvl_row_bytes, default
        the record); returns the symmetric capacity (records per node area)."""
        cap = 0
        rows = self.records_bytes // (nvl_row_bytes or record_bytes)
        for name in names:
            p = self.kernels[name].params
            cap = lay_mod.fill(p.lay, self.control, self.num_rdma_bytes, self.N, record_bytes)
            p.nvl_capacity_rows = rows
        return cap

    # ---- ep_rt.ht_op.HighThroughputOp ------------------------------------------------------------
    def check_dispatch(self, call: DispatchCall) -> None:
        """DeepEP's kernels read num_tokens_per_rdma_rank; ep_rt's derive the same counts, but a wrong one is still
        the caller's error."""
        if call.handle is None and call.num_tokens_per_rdma_rank is not None:
            validate.tensor(
                "num_tokens_per_rdma_rank",
                call.num_tokens_per_rdma_rank,
                dtype=torch.int32,
                ndim=1,
                device=self.device,
                rows=self.N,
            )

    def run_dispatch(self, call: DispatchCall, alloc_stream, comm_stream) -> DispatchResult:
        if self.qp_rule_num_qps is not None:  # DeepEP's queue-pair rule, where queue pairs carry the calls
            from ..transport.network_settings import check_ht_num_qps

            check_ht_num_qps(self.qp_rule_num_qps, call.num_channels)
        if call.handle is not None:
            handle = as_handle(InternodeHandle, call.handle, "cached dispatch")  # a rebuilt plain tuple too
            recv_x, recv_scales, tensors = self.cached_dispatch(
                call.x, call.x_scales, handle, alloc_stream, comm_stream
            )
            return DispatchResult(recv_x, recv_scales, None, None, None, None, tensors)
        return self.dispatch(
            call.x,
            call.x_scales,
            call.topk_idx,
            call.topk_weights,
            call.is_token_in_rank,
            call.num_tokens_per_expert,
            call.expert_alignment,
            call.num_worst_tokens,
            call.num_channels,
            alloc_stream,
            comm_stream,
        )

    def combine_handle(self, x, handle, topk_weights) -> InternodeHandle:
        """Its combine checks the handle's rows itself (check_handle_capacity)."""
        return as_handle(InternodeHandle, handle, "combine")

    # ---- dispatch -------------------------------------------------------------------------------
    def dispatch(
        self,
        x,
        x_scales,
        topk_idx,
        topk_weights,
        is_token_in_rank,
        num_tokens_per_expert,
        expert_alignment: int,
        num_worst_tokens: int,
        num_channels: int,
        alloc_stream,
        comm_stream,
        in_round: bool = False,
    ) -> DispatchResult | internode_rounds.RoundDoesNotFit:
        """alloc_stream None: allocate on the current stream (no stream context). in_round: a round of a call in
        rounds (ops/internode_rounds.py); one that does not fit moves nothing and returns RoundDoesNotFit with its
        maxima, so that the caller tries fewer tokens (an expected outcome, not an error)."""
        R, N, G, C = self.num_ranks, self.N, self.G, num_channels
        T, hidden = x.shape
        hidden_bytes = hidden * x.element_size()
        K = topk_idx.size(1) if topk_idx is not None else 0
        S = x_scales.size(1) if x_scales is not None else 0
        E = num_tokens_per_expert.numel()
        L = E // R
        dev = x.device
        worst = num_worst_tokens > 0
        plan = self._plan_for(("dispatch", hidden_bytes, hidden, S, K, E, C, expert_alignment, worst))
        # num_worst_tokens: the host does not wait for the counts (token 0 tells notify not to publish them), unless
        # the NVL buffer may be too small for one pass (the same test on every rank): then the counts decide whether
        # the call goes in rounds. Inside a CUDA-graph capture it cannot wait: one pass, and the kernels report a
        # call that does not fit (as they do for streams longer than the RDMA buffer's areas).
        wait = not worst or (
            num_worst_tokens > min(plan.records_rows, plan.combine_rows)
            and not torch.cuda.is_current_stream_capturing()
        )
        host_token = self._next_token() if wait else 0
        with allocating_on(alloc_stream):
            rdma_cpm = torch.empty(N, C, dtype=torch.int32, device=dev)
            gbl_cpm = torch.empty(R, C, dtype=torch.int32, device=dev)
            recv_rdma_cpm = torch.empty(N, C, dtype=torch.int32, device=dev)
            recv_rdma_prefix = torch.empty(N, dtype=torch.int32, device=dev)
            recv_gbl_cpm = torch.empty(R, C, dtype=torch.int32, device=dev)
            recv_gbl_prefix = torch.empty(R, dtype=torch.int32, device=dev)
            send_rdma_head = torch.empty(T, N, dtype=torch.int32, device=dev)
        ptr = _ptr
        p = self.kernels["notify"].params
        _copy(p, plan.params)
        p.x, p.x_scales, p.topk_idx, p.topk_weights = x.data_ptr(), ptr(x_scales), ptr(topk_idx), ptr(topk_weights)
        p.is_token_in_rank, p.num_tokens_per_expert = is_token_in_rank.data_ptr(), num_tokens_per_expert.data_ptr()
        p.rdma_cpm, p.gbl_cpm, p.recv_rdma_cpm = rdma_cpm.data_ptr(), gbl_cpm.data_ptr(), recv_rdma_cpm.data_ptr()
        p.recv_rdma_prefix, p.recv_gbl_cpm = recv_rdma_prefix.data_ptr(), recv_gbl_cpm.data_ptr()
        p.recv_gbl_prefix, p.send_rdma_head = recv_gbl_prefix.data_ptr(), send_rdma_head.data_ptr()
        p.host_token = host_token
        if S:
            p.scale_token_stride, p.scale_hidden_stride = x_scales.stride(0), x_scales.stride(1)
        else:
            p.scale_token_stride = p.scale_hidden_stride = 0
        p.num_tokens, p.topk_idx_bits = T, validate.bits(topk_idx)
        p.num_out_rows = p.num_fwd_rows = num_worst_tokens
        self._launch("notify", C, comm_stream)
        # Before the host wait, the send / forward / receive kernels' fields that do not depend on the counts (all
        # of notify's): after it only the outputs are allocated and their pointers written.
        send = self.kernels["send"].params
        _copy(send, p)

        facts = {}
        num_rows = num_fwd = num_worst_tokens
        if wait:
            self._wait_counters(host_token)
            c = self.counters
            num_recv, num_rdma_recv = c[abi.EP_RT_IN_HOST_NUM_RECV], c[abi.EP_RT_IN_HOST_NUM_RDMA_RECV]
            max_stream, max_recv = c[abi.EP_RT_IN_HOST_MAX_STREAM], c[abi.EP_RT_IN_HOST_MAX_RECV]
            max_fwd = c[abi.EP_RT_IN_HOST_MAX_FWD]
            # The same maxima on every rank, so every rank takes the same path and nothing waits for anyone.
            fits = max_stream <= min(plan.cap, plan.combine_cap) and max_recv <= min(
                plan.records_rows, plan.combine_rows
            )
            too_few_worst = worst and max(max_recv, max_fwd) > num_worst_tokens
            if in_round and not fits:  # (the same maxima on every rank: every rank retries alike)
                self._skip_data(send, C, comm_stream)
                return internode_rounds.RoundDoesNotFit(max_stream, max_recv)
            if not fits or too_few_worst:
                base = abi.EP_RT_IN_HOST_EXPERT_COUNTS
                per_expert = [] if worst else c[base : base + L]  # (the rounds' notifies overwrite them)
                # This notify's data kernels run, moving nothing, so that every rank's sequence numbers stay in step
                # (the flags the notify released belong to a call that completes).
                self._skip_data(send, C, comm_stream)
                if too_few_worst:
                    raise ValueError(
                        f"rank {self.rank}: num_worst_tokens={num_worst_tokens} but a rank receives or forwards "
                        f"{max(max_recv, max_fwd)} tokens; pass num_worst_tokens >= {max(max_recv, max_fwd)} "
                        f"(every rank raises this; nothing was moved and the Buffer stays usable)"
                    )
                return internode_rounds.dispatch(
                    self,
                    plan,
                    call_args=(x, x_scales, topk_idx, topk_weights, is_token_in_rank, num_tokens_per_expert),
                    expert_alignment=expert_alignment,
                    num_channels=C,
                    whole=(rdma_cpm, gbl_cpm, recv_rdma_cpm, recv_rdma_prefix, recv_gbl_cpm, recv_gbl_prefix),
                    send_rdma_head=send_rdma_head,
                    num_recv=num_recv,
                    num_rdma_recv=num_rdma_recv,
                    maxima=(max_stream, max_recv),
                    num_worst_tokens=num_worst_tokens,
                    per_expert=per_expert,
                    alloc_stream=alloc_stream,
                    comm_stream=comm_stream,
                )
            if not worst:
                num_rows, num_fwd = num_recv, num_rdma_recv
            facts = dict(max_dispatch_rows=max_recv, max_combine_rows=max_recv, max_stream=max_stream)

        with allocating_on(alloc_stream):
            recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=dev)
            recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=dev) if S else None
            recv_topk_idx = torch.empty(num_rows, K, dtype=validate.topk_idx_t, device=dev) if K else None
            recv_topk_weights = torch.empty(num_rows, K, dtype=torch.float32, device=dev) if K else None
            recv_src_meta = torch.empty(num_rows, _META_BYTES, dtype=torch.uint8, device=dev)
            send_nvl_head = torch.empty(num_fwd, G, dtype=torch.int32, device=dev)
        send.recv_x, send.recv_x_scales = recv_x.data_ptr(), ptr(recv_x_scales)
        send.recv_topk_idx, send.recv_topk_weights = ptr(recv_topk_idx), ptr(recv_topk_weights)
        send.recv_src_meta, send.send_nvl_head = recv_src_meta.data_ptr(), send_nvl_head.data_ptr()
        send.num_out_rows, send.num_fwd_rows = num_rows, num_fwd
        send.recv_topk_idx_bits = validate.bits(recv_topk_idx)
        self._launch_data_kernels(send, ("forward", "recv"), C, comm_stream)
        # With or without top-k, as DeepEP (its test_internode.py checks them in its first case). Read after the
        # launches: only notify writes the host counters, and this call's is done.
        base = abi.EP_RT_IN_HOST_EXPERT_COUNTS
        per_expert = [] if worst else self.counters[base : base + L]
        handle = InternodeHandle(
            is_token_in_rank,
            rdma_cpm,
            gbl_cpm,
            recv_rdma_cpm,
            recv_rdma_prefix,
            recv_gbl_cpm,
            recv_gbl_prefix,
            recv_src_meta,
            send_rdma_head,
            send_nvl_head,
        )
        with_facts(handle, HandleFacts.of(handle, self.serial, **facts))
        tensors = [
            x,
            x_scales,
            topk_idx,
            topk_weights,
            num_tokens_per_expert,
            recv_x,
            recv_x_scales,
            recv_topk_idx,
            recv_topk_weights,
            *handle,
        ]
        return DispatchResult(recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, per_expert, handle, tensors)

    def _launch_data_kernels(self, first, later, C: int, stream) -> None:
        """The send kernel from `first` (its struct), then forward and receive with a copy of it: the three take the
        same fields. The forward kernel runs N x C blocks."""
        for name in later:
            _copy(self.kernels[name].params, first)
        self._launch("send", C, stream)
        self._launch("forward", self.N * C, stream)
        self._launch("recv", C, stream)

    def _skip_data(self, notify_fields, C: int, stream) -> None:
        """The send, forward and receive kernels of a notify whose data does not move (a call that goes in rounds or
        raises): told to skip (the workspace's skip word, which the notify wrote and they read), they move no
        record, send a bare signal per chunk and advance the dispatch sequence number, so the start rows and flags
        this notify released can never be taken for the next call's."""
        send = self.kernels["send"].params
        _copy(send, notify_fields)
        send.recv_x = send.recv_x_scales = send.recv_topk_idx = send.recv_topk_weights = 0
        send.recv_src_meta = send.send_nvl_head = 0
        send.num_out_rows = send.num_fwd_rows = send.fill_unused = 0
        with torch.cuda.stream(stream):
            self.workspace[abi.EP_RT_IN_WS_SKIP].fill_(1)
        self._launch_data_kernels(send, ("forward", "recv"), C, stream)

    def _next_token(self) -> int:
        self.host_token = self.host_token % 0x7FFFFFFF + 1
        return self.host_token

    def check_handle_capacity(self, handle: InternodeHandle, record_bytes: int, combine: Optional[tuple]) -> None:
        """A cached dispatch or combine whose streams (or combine rows) would not fit, refused on every rank alike
        (the maxima in the handle's facts are the same on all ranks). combine = (hidden, K) for a combine."""
        facts = getattr(handle, "facts", None)
        if facts is None or facts.max_stream is None:
            return
        what = "combine" if combine else "cached dispatch"
        cap = lay_mod.capacity(self.num_rdma_bytes, self.N, record_bytes)
        if facts.max_stream > cap:
            raise self._too_small(what, facts.max_stream, cap, record_bytes, nvl=False)
        if combine is not None and facts.max_combine_rows is not None:
            rows = self._nvl_rows(*combine)
            if facts.max_combine_rows > rows:
                raise self._too_small(what, facts.max_combine_rows, rows, record_bytes, nvl=True)
        if combine is None and facts.max_dispatch_rows is not None:
            rows = self.records_bytes // record_bytes  # the records the forwarders push into each NVL buffer
            if facts.max_dispatch_rows > rows:
                raise self._too_small(what, facts.max_dispatch_rows, rows, record_bytes, nvl=True)

    def cached_dispatch(self, x, x_scales, handle: InternodeHandle, alloc_stream, comm_stream):
        if handle.rounds is not None:
            return internode_rounds.cached_dispatch(self, x, x_scales, handle, alloc_stream, comm_stream)
        T, hidden = x.shape
        hidden_bytes = hidden * x.element_size()
        S = x_scales.size(1) if x_scales is not None else 0
        num_rows = handle.recv_src_meta.size(0)
        C = handle.rdma_channel_prefix_matrix.size(1)
        plan = self._plan_for(("cached", hidden_bytes, hidden, S, 0, self.num_ranks, C, 1, False))
        self.check_handle_capacity(handle, plan.record, None)
        with allocating_on(alloc_stream):
            recv_x = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
            recv_x_scales = torch.empty(num_rows, S, dtype=x_scales.dtype, device=x.device) if S else None
        ptr = _ptr
        p = self.kernels["send"].params
        _copy(p, plan.params)
        p.x, p.x_scales, p.is_token_in_rank = x.data_ptr(), ptr(x_scales), handle.is_token_in_rank.data_ptr()
        p.rdma_cpm, p.gbl_cpm = (
            handle.rdma_channel_prefix_matrix.data_ptr(),
            handle.gbl_channel_prefix_matrix.data_ptr(),
        )
        p.recv_rdma_cpm = handle.recv_rdma_channel_prefix_matrix.data_ptr()
        p.recv_rdma_prefix = handle.recv_rdma_rank_prefix_sum.data_ptr()
        p.recv_gbl_cpm = handle.recv_gbl_channel_prefix_matrix.data_ptr()
        p.recv_gbl_prefix = handle.recv_gbl_rank_prefix_sum.data_ptr()
        p.send_rdma_head = handle.send_rdma_head.data_ptr()
        p.recv_x, p.recv_x_scales = recv_x.data_ptr(), ptr(recv_x_scales)
        if S:
            p.scale_token_stride, p.scale_hidden_stride = x_scales.stride(0), x_scales.stride(1)
        else:
            p.scale_token_stride = p.scale_hidden_stride = 0
        p.num_tokens, p.num_out_rows = T, num_rows
        self._launch_data_kernels(p, ("forward", "recv"), C, comm_stream)
        return recv_x, recv_x_scales, [x, x_scales, recv_x, recv_x_scales, *handle]

    # ---- combine --------------------------------------------------------------------------------
    def combine(self, x, handle: InternodeHandle, topk_weights, bias0, bias1, alloc_stream, comm_stream):
        if handle.rounds is not None:
            return internode_rounds.combine(self, x, handle, topk_weights, bias0, bias1, alloc_stream, comm_stream)
        return self.combine_into(x, handle, topk_weights, bias0, bias1, alloc_stream, comm_stream, None)

    def combine_into(self, x, handle: InternodeHandle, topk_weights, bias0, bias1, alloc_stream, comm_stream, into):
        """combine of a handle without rounds; into: (combined_x, combined_topk_weights) to write instead of new
        tensors (a round of a call in rounds writes its tokens' rows of the whole call's outputs), or None."""
        T = handle.is_token_in_rank.size(0)
        hidden = x.size(1)
        K = topk_weights.size(1) if topk_weights is not None else 0
        C = handle.rdma_channel_prefix_matrix.size(1)
        plan = self._plan_for(("combine", hidden, K, C))
        self.check_handle_capacity(handle, plan.record, (hidden, K))
        if into is not None:
            combined_x, combined_w = into
        else:
            with allocating_on(alloc_stream):
                combined_x = torch.empty(T, hidden, dtype=torch.bfloat16, device=x.device)
                combined_w = torch.empty(T, K, dtype=torch.float32, device=x.device) if K else None
        ptr = _ptr
        p = self.kernels["combine_publish"].params
        _copy(p, plan.params)
        p.x, p.topk_weights, p.bias0, p.bias1 = x.data_ptr(), ptr(topk_weights), ptr(bias0), ptr(bias1)
        p.rdma_cpm, p.recv_rdma_cpm = (
            handle.rdma_channel_prefix_matrix.data_ptr(),
            handle.recv_rdma_channel_prefix_matrix.data_ptr(),
        )
        p.recv_rdma_prefix = handle.recv_rdma_rank_prefix_sum.data_ptr()
        p.recv_gbl_prefix = handle.recv_gbl_rank_prefix_sum.data_ptr()
        p.send_rdma_head, p.send_nvl_head = handle.send_rdma_head.data_ptr(), handle.send_nvl_head.data_ptr()
        p.combined_x, p.combined_topk_weights = combined_x.data_ptr(), ptr(combined_w)
        p.num_tokens, p.num_in_rows = T, x.size(0)
        for name in ("combine_forward", "combine_reduce"):  # the same fields
            _copy(self.kernels[name].params, p)
        self._launch("combine_publish", C, comm_stream)
        self._launch("combine_forward", C, comm_stream)
        self._launch("combine_reduce", C, comm_stream)
        return combined_x, combined_w, [x, topk_weights, bias0, bias1, combined_x, combined_w, *handle]


def _ptr(t) -> int:
    return t.data_ptr() if t is not None else 0
