"""Low-latency (decode) dispatch and combine (kernels_src/low_latency.cu) over an NVSHMEM symmetric buffer.

Two alternating buffers as in DeepEP: every LL dispatch and combine uses buffer `idx`, then flips it.
A call is one kernel (send, then receive, in every block; launched cooperatively), as DeepEP's; with
`return_recv_hook` it is a send kernel that runs now on the current stream and a receive kernel that the hook
launches (EP_RT_LL_TWO_KERNELS=1 splits eager calls the same way, the receive started early). Nothing here
synchronises with the host, so the calls can be captured in CUDA graphs.
"""

from __future__ import annotations

import ctypes
import warnings

import torch

from .. import env, events, validate
from ..events import EventOverlap, StreamScope
from ..handles import next_serial
from ..errors import BufferTooSmallError, EpRtError
from ..runtime import abi, driver, modules
from ..runtime.call_plans import copy_struct, plan_for
from ..runtime.launch import Launcher
from ..transport import ll_layout, net_stats
from ..transport.device_view import device_tensor
from ..transport.error_record import ErrorRecords
from ..transport.symmetric import SymmetricBuffer, ll_peer_bases, unmapped_node_peers_warning
from ..transport.topology import Topology

_MAX_EXPERTS = abi.EP_RT_LL_MAX_SIGNALS
_FP8 = torch.float8_e4m3fn
SLOT = "low_latency"  # this op's slot in the ErrorRecords
MIN_CC = (9, 0)  # kernels_src/low_latency.cu's min_arch


class _Plan:
    """One call shape's parameter struct, filled once (issue 23): the buffer's areas and signal words, sizes, shape
    digest, format and the op's fixed pointers. A call copies it into the send kernel's struct and patches only its
    own tensors' pointers, token count, top-k and flags."""

    __slots__ = ("params", "address", "size")

    def __init__(self, params):
        self.params, self.address, self.size = params, ctypes.addressof(params), ctypes.sizeof(params)


class _ReceiveLaunch:
    """The receive kernel of one call, launched now or from a hook, exactly once, with the parameters its send kernel
    had. They stay in the receive launcher's struct until a later call of the same kind overwrites it; only then
    (a hook still held) are they copied into a snapshot of their own, so an eager call makes no copy."""

    __slots__ = ("op", "kind", "launcher", "grid", "buffer", "frozen", "launched")

    def __init__(self, op, kind, launcher, grid, buffer):
        self.op, self.kind, self.launcher, self.grid, self.buffer = op, kind, launcher, grid, buffer
        self.frozen, self.launched = None, False

    def freeze(self):
        if not self.launched and self.frozen is None:
            self.frozen = self.launcher.snapshot()

    def __call__(self, stream, early=False):
        if self.launched:
            raise EpRtError("this low-latency receive hook was already called (each hook runs once)")
        self.launched = True
        self.op.pending_recv[self.buffer] = False
        if self.frozen is not None:
            self.frozen(self.grid, stream, early)
            return
        self.op._unfrozen[self.kind] = None
        if early:
            self.launcher(self.grid, stream, early=True)
        else:
            self.launcher(self.grid, stream)


class LowLatencyOp:
    """Owns no resources: the symmetric buffer, the NVSHMEM session that registered `module`, and the error
    records are transports the Buffer made (and tears down); the workspace and mask are torch tensors.

    The per-call host path is lean (issue 23, docs/HOST_PATH.md): shapes already checked and call plans (_Plan) are
    kept, so a call validates its tensors, copies its plan and patches the pointers. Plans read the op's fixed state
    (pointers, rank, timeout) when they are built."""

    # Made on first use (an op built with object.__new__, as the CPU tests do, has them too).
    _fit = None  # (T, hidden, num_experts) shapes check_shape accepted
    call_plans = None  # (kind, T, hidden, num_experts, message format, buffer) -> _Plan
    _unfrozen = None  # kind -> the _ReceiveLaunch still reading its receive launcher's struct
    two_kernels = False  # EP_RT_LL_TWO_KERNELS, read by __init__
    packed = False  # the module is a packed variant (EP_RT_LL_PACKED): ll_layout's packed offsets
    on_comm_stream = False  # the last LL kernels ran on the comm stream (maybe not waited for: async_finish)

    @staticmethod
    def require_arch(cc: tuple[int, int]) -> None:
        """The LL kernels use programmatic dependent launch (griddepcontrol), which needs sm_90 or newer."""
        if cc < MIN_CC:
            raise EpRtError(
                f"low-latency mode needs a GPU of compute capability {MIN_CC[0]}.{MIN_CC[1]} or newer "
                f"(its kernels use programmatic dependent launch, an sm_90 feature); this GPU is "
                f"{cc[0]}.{cc[1]} (sm_{cc[0]}{cc[1]}). The high-throughput intranode mode runs on it: "
                f"Buffer(group, num_nvl_bytes) without low_latency_mode."
            )

    @staticmethod
    def cubin_entry(
        device_index: int, nvshmem_flavour: str | None, chaos: bool | None = None, packed: bool | None = None
    ) -> dict:
        """The LL cubin for this device and driver, of the NVSHMEM host library's flavour (cu12 / cu13); its chaos
        variant (a test transport for the puts to other nodes) when `chaos`, by default EP_RT_CHAOS_TRANSPORT, says
        so; its packed layout when `packed`, by default EP_RT_LL_PACKED, says so."""
        return modules.choose_entry(
            modules.manifest(), "low_latency", device_index, False, nvshmem_flavour, chaos, packed=packed
        )

    @staticmethod
    def symmetric_bytes(num_rdma_bytes: int, num_ranks: int, control_start: int | None = None) -> int:
        """The symmetric allocation: the caller's num_rdma_bytes, then ep_rt's control area (ll_layout), which
        starts at control_start when another op's control area comes first (the buffer both modes share)."""
        return ll_layout.control_offsets(num_rdma_bytes if control_start is None else control_start, num_ranks)["end"]

    def __init__(
        self,
        topology: Topology,
        sym: SymmetricBuffer,
        module,
        num_rdma_bytes: int,
        device_index: int,
        timeout_s: float,
        errors: ErrorRecords,
        enable_shrink: bool,
        control_start: int | None = None,
        allow_nvlink: bool = True,
    ):
        """control_start: where this op's control area starts in `sym` (default: right after num_rdma_bytes); the
        Buffer whose two modes share one symmetric buffer puts it after the internode op's control area.
        allow_nvlink: the Buffer's allow_nvlink_for_low_latency_mode (False: node peers unmapped on purpose)."""
        self.rank, self.num_ranks = topology.rank, topology.num_ranks
        if self.num_ranks > 256:
            raise NotImplementedError("ep_rt's low-latency kernels serve at most 256 ranks")
        self.device = torch.device("cuda", device_index)
        self.num_rdma_bytes = num_rdma_bytes
        self.timeout_ns = int(timeout_s * 1e9)
        self.idx = 0
        self.errors = errors
        self.error_dev_ptr = errors.device_ptr(SLOT)
        self.num_sms = driver.multiprocessor_count(device_index)
        # ep_rt's control area (credits, count signals, combine flags) follows the caller's num_rdma_bytes, so the
        # size hint stays DeepEP's (ll_layout.control_offsets, params.h).
        self.control = ll_layout.control_offsets(
            num_rdma_bytes if control_start is None else control_start, self.num_ranks
        )
        self.sym_bytes = self.control["end"]
        self.sym = sym.ptr
        self.module = module  # which cubin (module.entry: variant, path); test kernels of the family launch from it
        self.packed = module.entry.get("variant") in ("packed", "packed_chaos")  # the buffer layout its kernels use
        # The chaos variant counts its network operations and charges each quiet a sweep (transport.net_stats).
        self.net_stats = net_stats.charged(module, self.device, topology.num_ranks)
        # Who is reached by NVLink stores and who by NVSHMEM operations (never this rank itself; symmetric.py).
        bases, unmapped = ll_peer_bases(sym.mapped_bases, topology, sym.ptr)
        if unmapped and allow_nvlink:
            warnings.warn(unmapped_node_peers_warning(self.rank, unmapped), stacklevel=2)
        self.peer_bases = torch.tensor(bases, dtype=torch.int64, device=self.device)
        self.nvlink_peers = sum(1 for b in bases if b != 0)
        # Per buffer: a receive hook handed out and not yet called. The next call on that buffer would wait for a
        # receive that cannot run before it, so it is refused on the host instead.
        self.pending_recv = [False, False]
        self.workspace = torch.zeros(abi.EP_RT_LL_WS_COUNTERS + _MAX_EXPERTS, dtype=torch.int32, device=self.device)
        self.mask = torch.zeros(self.num_ranks, dtype=torch.int32, device=self.device) if enable_shrink else None
        self.kernels = {
            name: Launcher(module, f"ep_rt_ll_{name}", abi.LowLatencyParams)
            for name in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
        }
        # One kernel per eager call: its blocks wait in the receive half for what other blocks still send, so
        # they must all be resident at once (a cooperative launch, as DeepEP's).
        self.fused = {
            name: Launcher(module, f"ep_rt_ll_{name}", abi.LowLatencyParams, cooperative=True)
            for name in ("dispatch", "combine")
        }
        self.two_kernels = env.ll_two_kernels()  # eager calls split as hooked ones (an A/B knob)
        self._barrier = Launcher(module, "ep_rt_ll_barrier", abi.LowLatencyParams)
        self.barrier_seq = 0
        self.timeout_s = timeout_s
        self.serial = next_serial()  # the owner its handles name
        errors.on_rearm(SLOT, lambda: self.workspace[abi.EP_RT_LL_WS_CLAIM].zero_())
        # Grids that fill the GPU in one wave. The dispatch receive blocks meet once (every count known) before
        # taking even shares of the messages, so that grid must be resident at once; two blocks per SM are plenty.
        launchers = {**self.kernels, **self.fused}
        per_sm = {name: driver.max_active_blocks(k.function, k.block, 0) for name, k in launchers.items()}
        if min(per_sm.values()) < 1:
            raise EpRtError(f"an LL kernel cannot run on this GPU (blocks per SM: {per_sm})")
        self.dispatch_recv_grid = self.num_sms * min(2, per_sm["dispatch_recv"])
        self.combine_send_grid = self.num_sms * per_sm["combine_send"]
        # The one-kernel calls: every block co-resident (the cooperative launch refuses more).
        self.dispatch_grid = self.num_sms * min(2, per_sm["dispatch"])
        self.combine_grid = self.num_sms * per_sm["combine"]
        torch.cuda.synchronize(self.device)

    # ---- state ----------------------------------------------------------------------------------
    def raise_if_failed(self) -> None:
        self.errors.raise_if_failed(SLOT)

    @property
    def failed(self):
        return self.errors.check(SLOT)

    def _take_buffer(self) -> int:
        """The buffer this call uses (then the other one is next), refused while its last hook is held."""
        b = self.idx
        if self.pending_recv[b]:
            raise EpRtError(
                "the receive hook of the low-latency call before the previous one was never called; it used the "
                "same buffer as this call (ep_rt alternates two buffers, as DeepEP). Call every hook before the "
                "next-but-one low-latency call; nothing was launched, so calling it now and retrying works."
            )
        self.idx = b ^ 1
        return b

    def _plan(self, kind: str, T: int, hidden: int, num_experts: int, message_format: int, b: int) -> _Plan:
        return plan_for(self, (kind, T, hidden, num_experts, message_format, b), self._build_plan)

    def _build_plan(self, kind: str, T: int, hidden: int, num_experts: int, message_format: int, b: int) -> _Plan:
        p = abi.LowLatencyParams()
        if kind == "dispatch":
            use_fp8 = message_format == 1
            self._common(
                p,
                T,
                hidden,
                num_experts,
                ll_layout.dispatch_slot_bytes(hidden, use_fp8),
                combine=False,
                message_format=message_format,
                b=b,
            )
            p.topk_weights, p.use_fp8, p.zero_copy, p.use_logfmt = 0, int(use_fp8), 0, 0
        else:
            use_logfmt = message_format == 3
            self._common(
                p,
                T,
                hidden,
                num_experts,
                ll_layout.combine_slot_bytes(hidden, use_logfmt),
                combine=True,
                message_format=message_format,
                b=b,
            )
            p.recv_x_scales, p.recv_count, p.cumulative_stats = 0, 0, 0
            p.use_fp8, p.round_scale, p.use_ue8m0, p.use_logfmt = 0, 0, 0, int(use_logfmt)
        return _Plan(p)

    def _common(
        self, p, T: int, hidden: int, num_experts: int, msg_bytes: int, combine: bool, message_format: int, b: int = 0
    ) -> None:
        """Fill the fields every LL kernel shares for buffer `b` and this shape (a call plan's, built once)."""
        offsets = self._offsets(T, hidden, num_experts)
        p.peer_bases, p.sym_base = self.peer_bases.data_ptr(), self.sym
        p.workspace = self.workspace.data_ptr()
        p.mask = self.mask.data_ptr() if self.mask is not None else 0
        p.error = self.error_dev_ptr
        p.send_off, p.recv_off = offsets["send"][b], offsets["recv"][b]
        p.signal_off = self.control["combine_flag" if combine else "count_signal"][b]
        p.arrival_off = self.control["combine_arrival" if combine else "dispatch_arrival"][b]
        p.credit_off = self.control["credit"]
        p.msg_bytes, p.timeout_ns = msg_bytes, self.timeout_ns
        p.has_remote_peers = int(self.nvlink_peers < self.num_ranks)
        p.rank, p.num_ranks, p.max_tokens, p.hidden, p.num_experts, p.buffer_idx = (
            self.rank,
            self.num_ranks,
            T,
            hidden,
            num_experts,
            b,
        )
        p.shape_digest = ll_layout.shape_digest(T, hidden, num_experts, message_format)

    def check_shape(self, T: int, hidden: int, num_experts: int) -> None:
        """The (num_max_dispatch_tokens_per_rank, hidden, num_experts) of an LL call: ranges, and fits the buffer."""
        R = self.num_ranks
        for name, v in (("num_max_dispatch_tokens_per_rank", T), ("hidden", hidden), ("num_experts", num_experts)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, got {v!r}")
        if not 1 <= T <= abi.EP_RT_LL_MAX_TOKENS:
            raise ValueError(f"num_max_dispatch_tokens_per_rank must be in 1..{abi.EP_RT_LL_MAX_TOKENS}, got {T}")
        if hidden % 128 or not 0 < hidden <= abi.EP_RT_LL_MAX_HIDDEN:
            raise ValueError(
                f"low-latency hidden size must be a multiple of 128 in [128, {abi.EP_RT_LL_MAX_HIDDEN}], got {hidden}"
            )
        if num_experts <= 0 or num_experts % R or num_experts > _MAX_EXPERTS:
            raise ValueError(
                f"num_experts must be a positive multiple of {R} ranks up to {_MAX_EXPERTS}, got {num_experts!r}"
            )
        self._offsets(T, hidden, num_experts)

    def _check_shape_once(self, T, hidden: int, num_experts) -> None:
        """check_shape, skipped for a shape it already accepted (exact ints only: a bool or float is checked again
        and refused)."""
        fit = self._fit
        if fit is None:
            fit = self._fit = set()
        if T.__class__ is int and num_experts.__class__ is int and (T, hidden, num_experts) in fit:
            return
        self.check_shape(T, hidden, num_experts)
        fit.add((T, hidden, num_experts))

    def _offsets(self, T: int, hidden: int, num_experts: int) -> dict:
        """The buffers' areas for this shape (ll_layout.buffer_offsets), or BufferTooSmallError if it does not fit."""
        offsets = ll_layout.buffer_offsets(T, hidden, num_experts, self.num_rdma_bytes, self.packed, self.num_ranks)
        if offsets["need"] > offsets["half"]:
            need = ll_layout.rdma_size_hint(T, hidden, self.num_ranks, num_experts, self.packed)
            layout = "(the packed layout, EP_RT_LL_PACKED=1) " if self.packed else ""
            raise BufferTooSmallError(
                f"low-latency calls with {T} tokens per rank, hidden {hidden} and {num_experts} experts need "
                f"{layout}num_rdma_bytes >= {need} (Buffer.get_low_latency_rdma_size_hint); this Buffer has "
                f"{self.num_rdma_bytes}"
            )
        return offsets

    def _check(self, x, topk_idx, T, num_experts):
        validate.tensor("x", x, dtype=torch.bfloat16, ndim=2, device=self.device)
        N, H = x.shape
        self._check_shape_once(T, H, num_experts)
        if N > T:
            raise ValueError(f"x has {N} tokens, more than num_max_dispatch_tokens_per_rank={T}")
        # No host check of the values (it would sync every decode step and break graph capture): the send
        # kernel reports an expert id >= num_experts through the error record, raised at the next call.
        validate.tensor("topk_idx", topk_idx, dtypes=validate.TOPK_IDX_DTYPES, ndim=2, device=self.device, rows=N)
        if topk_idx.size(1) > abi.EP_RT_LL_MAX_TOPK:
            raise ValueError(f"low-latency top-k is at most {abi.EP_RT_LL_MAX_TOPK}, got {topk_idx.size(1)}")
        if self.packed:
            self.check_packed_topk(topk_idx.size(1), num_experts)
        return N, H

    @staticmethod
    def check_packed_topk(K: int, num_experts: int) -> None:
        """The packed layout keeps min(16, num_experts) slots per token: a top-k above the expert count has none."""
        if K > ll_layout.packed_stride(num_experts):
            raise ValueError(
                f"with EP_RT_LL_PACKED=1 the top-k ({K}) must be at most the number of experts ({num_experts})"
            )

    def _receive_launcher(self, kind: str, send: Launcher, recv: Launcher, grid: int, b: int) -> _ReceiveLaunch:
        """The receive kernel with the send kernel's parameters: launch(stream, early), now or from a hook, exactly
        once. early=True (right behind the send kernel on the same stream) lets its blocks start while the send
        kernel finishes: the receive kernel waits for its data through the signals anyway."""
        unfrozen = self._unfrozen
        if unfrozen is None:
            unfrozen = self._unfrozen = {}
        held = unfrozen.get(kind)
        if held is not None:
            held.freeze()  # a hook still held reads this struct: it gets its own copy before it is overwritten
        copy_struct(recv.params, send.params)
        self.pending_recv[b] = True
        launch = unfrozen[kind] = _ReceiveLaunch(self, kind, recv, grid, b)
        return launch

    # ---- a call's modes and streams (DeepEP's rules) ----------------------------------------------
    @staticmethod
    def check_modes(async_finish: bool, return_recv_hook: bool) -> None:
        if async_finish and return_recv_hook:
            raise ValueError("async_finish and return_recv_hook cannot be used together")

    def check_queue_depth(self, T: int, qp_depth: int) -> None:
        """DeepEP's rule once a peer is reached over the network (RDMA queue pairs; NVLink peers need none): a
        queue holds every message of a dispatch, NVSHMEM_QP_DEPTH >= (num_max_dispatch_tokens_per_rank + 1) * 2."""
        if self.nvlink_peers < self.num_ranks and qp_depth < (T + 1) * 2:
            raise ValueError(
                f"NVSHMEM_QP_DEPTH={qp_depth} must be >= (num_max_dispatch_tokens_per_rank + 1) * 2 = {(T + 1) * 2}"
            )

    def run(self, start, async_finish: bool, return_recv_hook: bool, touched, comm_stream):
        """One call under DeepEP's LL stream rules: with a hook, the send kernel runs on the current stream now and
        the hook launches the receive kernel on the then-current stream; otherwise the call runs on the comm stream
        (which first waits for the current one; the current stream waits for it after, unless async_finish).
        `start(stream, split)` launches the call (with `split`, its send kernel only) and returns (result,
        launch_recv), launch_recv None when the call is already whole; `touched(result)` lists the tensors the comm
        stream used. Returns (result, event, hook)."""
        if return_recv_hook:
            # The last LL kernels ran on the comm stream, maybe not waited for (async_finish). Not during a graph
            # capture: the capturing stream must not wait on work outside the capture (captures start from a sync).
            if self.on_comm_stream and not torch.cuda.is_current_stream_capturing():
                events.wait_stream(events.current_stream(), comm_stream)
                self.on_comm_stream = False
            result, launch_recv = start(events.current_stream(), True)
            return result, EventOverlap(None), (lambda: launch_recv(events.current_stream()))
        scope = StreamScope(comm_stream, None, async_finish, False)
        result, launch_recv = start(comm_stream, False)
        if launch_recv is not None:  # EP_RT_LL_TWO_KERNELS: the receive kernel starts early, behind the send
            launch_recv(comm_stream, early=True)
        self.on_comm_stream = True
        return result, scope.finish(touched(result) if async_finish else ()), None  # (only async keeps tensors)

    # ---- dispatch -------------------------------------------------------------------------------
    def dispatch(
        self,
        x,
        topk_idx,
        T,
        num_experts,
        cumulative_stats,
        wait_stats,
        use_fp8,
        round_scale,
        use_ue8m0,
        stream,
        split=False,
    ):
        """Launch the call on `stream`: one kernel, or with `split` (a receive hook) its send kernel only. Returns
        the outputs and, with `split` (or EP_RT_LL_TWO_KERNELS), a launcher of the receive kernel; else None."""
        self.raise_if_failed()
        R = self.num_ranks
        N, H = self._check(x, topk_idx, T, num_experts)
        if use_ue8m0 and not round_scale:
            raise ValueError("use_ue8m0 requires round_scale=True")
        if use_ue8m0 and H % 512:
            raise ValueError(f"use_ue8m0 packs 4 scales per int32: hidden must be a multiple of 512, got {H}")
        L = num_experts // R
        if cumulative_stats is not None:
            validate.tensor(
                "cumulative_local_expert_recv_stats",
                cumulative_stats,
                dtype=torch.int32,
                ndim=1,
                device=self.device,
                rows=L,
            )
        if wait_stats is not None:
            validate.tensor(
                "dispatch_wait_recv_cost_stats", wait_stats, dtype=torch.int64, ndim=1, device=self.device, rows=R
            )
        plan = self._plan("dispatch", T, H, num_experts, int(use_fp8), self.idx)
        b = self._take_buffer()
        split = split or self.two_kernels
        send = self.kernels["dispatch_send"] if split else self.fused["dispatch"]
        p = send.params
        ctypes.memmove(ctypes.addressof(p), plan.address, plan.size)
        RT, S = R * T, H // 128
        dev = self.device
        recv_x = torch.empty(L, RT, H, dtype=_FP8 if use_fp8 else torch.bfloat16, device=dev)
        scales = None
        if use_fp8:
            cols = S // 4 if use_ue8m0 else S
            # [L, RT, cols] column-major in its last two dimensions (DeepEP's layout), made in one call: an
            # empty [L, cols, RT] and a transpose cost ~1.4 us more Python (timed on the CPU)
            scales = torch.empty_strided(
                (L, RT, cols), (cols * RT, 1, RT), dtype=torch.int32 if use_ue8m0 else torch.float32, device=dev
            )
            p.recv_x_scales = scales.data_ptr()
        else:
            p.recv_x_scales = 0
        if self.packed:  # plane 1 gets each row's k (its combine slot at the source); the handle holds plane 0
            src_info = torch.empty(2, L, RT, dtype=torch.int32, device=dev)[0]
        else:
            src_info = torch.empty(L, RT, dtype=torch.int32, device=dev)
        layout_range = torch.empty(L, R, dtype=torch.int64, device=dev)
        count = torch.empty(L, dtype=torch.int32, device=dev)
        p.x, p.topk_idx, p.recv_x = x.data_ptr(), topk_idx.data_ptr(), recv_x.data_ptr()
        p.recv_src_info, p.recv_layout_range, p.recv_count = (
            src_info.data_ptr(),
            layout_range.data_ptr(),
            count.data_ptr(),
        )
        p.cumulative_stats = cumulative_stats.data_ptr() if cumulative_stats is not None else 0
        p.wait_stats = wait_stats.data_ptr() if wait_stats is not None else 0
        p.num_tokens, p.num_topk, p.topk_idx_bits = N, topk_idx.size(1), topk_idx.element_size() * 8
        p.round_scale, p.use_ue8m0 = int(round_scale), int(use_ue8m0)
        outputs = (recv_x, scales, count, src_info, layout_range)
        if not split:
            send(self.dispatch_grid, stream)
            return outputs, None
        send(max(1, min(N, self.num_sms)), stream)
        return outputs, self._receive_launcher(
            "dispatch", send, self.kernels["dispatch_recv"], self.dispatch_recv_grid, b
        )

    # ---- combine --------------------------------------------------------------------------------
    def combine(
        self,
        x,
        topk_idx,
        topk_weights,
        src_info,
        layout_range,
        T,
        hidden,
        num_experts,
        out,
        wait_stats,
        zero_copy,
        use_logfmt,
        stream,
        split=False,
        src_info_checked=False,
    ):
        """Launch the call on `stream`, as dispatch (one kernel, or with `split` the send kernel and a launcher of
        the receive kernel); returns `out` and that launcher or None. With `use_logfmt` rows travel LogFMT-10
        encoded (kernels_src/include/ep_rt/logfmt.cuh), in the same slots. `src_info_checked`: the caller knows
        src_info is the dispatch's own tensor (a handle whose facts held), so the packed layout's plane check is
        skipped."""
        self.raise_if_failed()
        R = self.num_ranks
        L = num_experts // R
        validate.tensor("x", x, dtype=torch.bfloat16, ndim=3, device=self.device)
        if tuple(x.shape) != (L, R * T, hidden):
            raise ValueError(
                f"x must be [{L}, {R * T}, {hidden}] (local experts, ranks x max tokens, hidden), got {tuple(x.shape)}"
            )
        validate.tensor("topk_idx", topk_idx, dtypes=validate.TOPK_IDX_DTYPES, ndim=2, device=self.device)
        N = topk_idx.size(0)
        if N > T or topk_idx.size(1) > abi.EP_RT_LL_MAX_TOPK:
            raise ValueError(f"topk_idx must have at most {T} rows and {abi.EP_RT_LL_MAX_TOPK} columns")
        validate.tensor("topk_weights", topk_weights, dtype=torch.float32, ndim=2, device=self.device, rows=N)
        if topk_weights.size(1) != topk_idx.size(1):
            raise ValueError("topk_weights must have the shape of topk_idx")
        validate.tensor("handle src_info", src_info, dtype=torch.int32, ndim=2, device=self.device)
        validate.tensor("handle layout_range", layout_range, dtype=torch.int64, ndim=2, device=self.device, rows=L)
        if self.packed:
            self.check_packed_topk(topk_idx.size(1), num_experts)
            if not src_info_checked:
                check_packed_src_info(src_info, L, R * T)
        if out is None:
            out = torch.empty(N, hidden, dtype=torch.bfloat16, device=self.device)
        else:
            validate.tensor("out", out, dtype=torch.bfloat16, ndim=2, device=self.device, rows=N)
            if out.size(1) != hidden:
                raise ValueError(f"out must be [{N}, {hidden}]")
        if wait_stats is not None:
            validate.tensor(
                "combine_wait_recv_cost_stats", wait_stats, dtype=torch.int64, ndim=1, device=self.device, rows=R
            )
        plan = self._plan("combine", T, hidden, num_experts, 2 + int(use_logfmt), self.idx)
        b = self._take_buffer()
        split = split or self.two_kernels
        send = self.kernels["combine_send"] if split else self.fused["combine"]
        p = send.params
        ctypes.memmove(ctypes.addressof(p), plan.address, plan.size)
        p.x, p.topk_idx, p.topk_weights, p.recv_x = (
            x.data_ptr(),
            topk_idx.data_ptr(),
            topk_weights.data_ptr(),
            out.data_ptr(),
        )
        p.recv_src_info, p.recv_layout_range = src_info.data_ptr(), layout_range.data_ptr()
        p.wait_stats = wait_stats.data_ptr() if wait_stats is not None else 0
        p.num_tokens, p.num_topk, p.topk_idx_bits = N, topk_idx.size(1), topk_idx.element_size() * 8
        p.zero_copy = int(zero_copy)
        if not split:
            send(self.combine_grid, stream)
            return out, None
        send(self.combine_send_grid, stream)  # even shares of the rows
        # Receive work items are (token, chunk of one block's threads' int4 of the row): two blocks per SM at most.
        items = N * -(-hidden // (8 * self.kernels["combine_recv"].block))
        return out, self._receive_launcher(
            "combine", send, self.kernels["combine_recv"], max(1, min(items, 2 * self.num_sms)), b
        )

    # ---- buffers --------------------------------------------------------------------------------
    def rdma_tensor(self) -> torch.Tensor:
        """The caller's num_rdma_bytes of the symmetric buffer as uint8 (no copy)."""
        return device_tensor(self.sym, (self.num_rdma_bytes,), self.device)

    def next_combine_buffer(self, T: int, hidden: int, num_experts: int) -> torch.Tensor:
        """bf16 view [L, R*T, hidden] of the staging area the next LL call (a combine) reads with zero_copy."""
        offsets = self._offsets(T, hidden, num_experts)
        L, RT = num_experts // self.num_ranks, self.num_ranks * T
        row = ll_layout.combine_slot_bytes(hidden, use_logfmt=False)  # zero_copy is never LogFMT
        base = self.sym + offsets["send"][self.idx]
        return device_tensor(base, (L, RT, hidden), self.device, "<i2", (RT * row, row, 2)).view(torch.bfloat16)

    def barrier(self, stream=None) -> None:
        """A barrier over the unmasked ranks with a deadline (ep_rt_ll_barrier), then a host sync; in shrink mode a
        rank that never comes is masked, otherwise the timeout raises CommTimeoutError. NVSHMEM's barrier_all has no
        deadline and no mask, so ep_rt never calls it where a peer may be gone."""
        self.raise_if_failed()
        stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        self.launch_barrier(stream)
        stream.synchronize()
        self.raise_if_failed()

    def launch_barrier(self, stream) -> None:
        """The barrier kernel on `stream`, not waited for: it signals every rank and ends once every unmasked rank
        signalled (or records the timeout in this op's error slot, which the next call raises). A peer signals once
        its earlier kernels on its stream ended (CUDA stream order), so kernels after this one on `stream` start
        after every unmasked peer's earlier calls ended. No quiet: nothing of this rank's is completed by it."""
        self.barrier_seq += 1
        p = self._barrier.params
        p.peer_bases, p.sym_base = self.peer_bases.data_ptr(), self.sym
        p.workspace = self.workspace.data_ptr()
        p.mask = self.mask.data_ptr() if self.mask is not None else 0
        p.error, p.timeout_ns = self.error_dev_ptr, self.timeout_ns
        p.signal_off, p.barrier_seq = self.control["barrier"], self.barrier_seq
        p.rank, p.num_ranks, p.num_experts = self.rank, self.num_ranks, self.num_ranks
        self._barrier(1, stream)

    def masked_ranks(self) -> list[int]:
        return [] if self.mask is None else [r for r, m in enumerate(self.mask.tolist()) if m]

    def clean(self, T: int, hidden: int, num_experts: int) -> None:
        """Zero the control area (signals, credits) and the epochs on every unmasked rank (collective, with a
        deadline: barriers of ep_rt_ll_barrier, which skip masked ranks). The layout does not depend on the shape,
        but the shape is checked as DeepEP's (it must fit this Buffer)."""
        self.check_shape(T, hidden, num_experts)
        torch.cuda.synchronize(self.device)
        self.barrier()  # nobody still writes into us
        start = self.control["credit"]
        driver.memset_d8(self.sym + start, 0, self.control["barrier"] - start)
        self.workspace.zero_()
        self.idx = 0
        self.pending_recv = [False, False]
        torch.cuda.synchronize(self.device)
        self.barrier()  # everybody is clean before anybody writes again


def check_packed_src_info(src_info, L: int, RT: int) -> None:
    """The packed layout's combine reads each row's k from plane 1 of the allocation whose plane 0 is the handle's
    src_info (the dispatch makes it [2, L, R x T] and returns plane 0, DeepEP's tensor): the handle must hold that
    very view, not a copy."""
    base = src_info._base
    if (
        base is None
        or tuple(base.shape) != (2, L, RT)
        or base.dtype != torch.int32
        or src_info.data_ptr() != base.data_ptr()
        or tuple(src_info.shape) != (L, RT)
        or src_info.stride() != (RT, 1)
    ):
        raise ValueError(
            f"with EP_RT_LL_PACKED=1 the handle's src_info must be the tensor the low-latency dispatch returned (plane "
            f"0 of a [2, {L}, {RT}] int32 allocation whose plane 1 holds each row's top-k slot); this one is "
            f"{tuple(src_info.shape)} with base {None if base is None else tuple(base.shape)}: a copy or a rebuilt "
            f"tensor lacks that plane. Pass the handle the dispatch returned."
        )
