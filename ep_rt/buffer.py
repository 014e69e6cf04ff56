"""ep_rt.Buffer: DeepEP V1's Buffer API. It composes transports (Topology, error records, the NVL buffer of a
node, the NVSHMEM session and a symmetric buffer) into ops (layout, intranode, low-latency) and tears the
transports down in reverse order of construction."""

from __future__ import annotations

import warnings
from typing import Optional, Tuple, Union

import torch

from . import buffer_memory, buffer_plan, call_guard, config as config_mod, config_file, env, validate
from .config import Config
from .deep_ep_runtime import DeepEPRuntime
from .errors import EpRtError
from .events import EventHandle, EventOverlap, StreamScope, wait_stream
from .handles import HandleFacts, LowLatencyHandle, as_handle, with_facts
from .ht_op import DispatchCall
from .ops import ht_args
from .ops.intranode import IntranodeOp
from .ops.layout import LayoutOp
from .ops.mode_switch import ModeSwitch
from .runtime import driver, modules
from .transport import agreement, collective
from .transport.error_record import INPUT_SLOT, ErrorRecords
from .transport.host_wait import settle_after_interrupt
from .transport.nvl import NvlBuffer
from .transport.topology import Topology
from .utils import check_nvlink_connections

# What deep_ep/buffer.py's namespace offers the code that imports from it (`from deep_ep.buffer import Buffer`).
__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "check_nvlink_connections"]


class _Setup:
    """What Buffer._prepare decided (the same on every rank once agreement.exchange returned)."""

    def __init__(self, plan: buffer_plan.BufferPlan):
        self.plan = plan
        self.entries: dict = {}  # kernel family -> manifest entry of its NVSHMEM-linked cubin
        self.nvshmem = None  # transport.nvshmem.Preparation, when the Buffer uses NVSHMEM


class Buffer:
    """Communication buffers for MoE expert parallelism, with DeepEP V1's API: high-throughput dispatch and combine
    within a node (NVLink) and across nodes (NVSHMEM: RDMA between nodes, NVLink inside each), and the low-latency
    dispatch and combine (NVSHMEM). The constructor is collective over `group`; so are the calls, which every rank
    must make in the same order with matching shapes.

    Attributes:
        num_sms: the SM count of the high-throughput configs that get_dispatch_config / get_combine_config return
            (class-wide, set_num_sms); ep_rt's calls run config.num_sms channels (DeepEP's: num_sms / 2).
        rank: this rank's index in `group`.
        group_size: the number of ranks in `group`.
        group: the torch.distributed process group.
        num_nvl_bytes: the size of the NVL buffer (the traffic between the ranks of a node, in both HT modes).
        num_rdma_bytes: the size of the RDMA (NVSHMEM symmetric) buffer: the low-latency mode, and internode mode
            (both modes share one, as DeepEP's, when a Buffer has both; ops/mode_switch.py).
        low_latency_mode: whether the low-latency calls are available.
        runtime: DeepEP's C++ runtime methods, answered from this Buffer (ep_rt.deep_ep_runtime).
        topology (ep_rt): ranks, nodes and local ranks as ep_rt found them (by host, or EP_RT_RANKS_PER_NODE).
        comm_stream: the stream the calls run on unless a receive hook is asked for (get_comm_stream).

    ep_rt: the kernels are compiled ahead of time and launched from Python; every wait has a deadline, and a kernel's
    failure is raised as an ep_rt.errors exception naming the rank, the peer and the phase (raise_if_failed)."""

    num_sms: int = 20
    _modes = None  # ops.mode_switch.ModeSwitch when both modes share one symmetric buffer (set by _build)

    def __init__(
        self,
        group,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        use_fabric: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm=None,
        timeout_s: Optional[float] = None,
    ):
        """Create the buffers and connect the ranks of `group` (collective: every rank of the group calls it with the
        same sizes and modes, which are compared first and refused on every rank if they differ).

        Arguments:
            group: the torch.distributed process group of the expert-parallel ranks (None with `comm`).
            num_nvl_bytes: the NVL buffer size in bytes (a multiple of 128) for high-throughput calls; size it with
                Config.get_nvl_buffer_size_hint. 0: no intranode buffer.
            num_rdma_bytes: the RDMA buffer size in bytes (a multiple of 128) for the low-latency mode
                (get_low_latency_rdma_size_hint) and for high-throughput calls across nodes
                (Config.get_rdma_buffer_size_hint); must be 0 on one node without low_latency_mode.
            low_latency_mode: whether to set up the low-latency calls (needs num_rdma_bytes > 0, and sm_90 or newer).
            num_qps_per_rank: the queue pairs per peer NVSHMEM opens for IBGDA (as DeepEP's); checked against
                config.num_sms for internode calls that run over IBGDA.
            allow_nvlink_for_low_latency_mode: whether low-latency traffic to peers on this node may use NVLink
                (DeepEP's NVSHMEM_DISABLE_P2P rule).
            allow_mnnvl: let NVSHMEM decide on multi-node NVLink (default: disabled, as DeepEP does).
            use_fabric: fabric (MNNVL) memory handles; not implemented, raises NotImplementedError.
            explicitly_destroy: if set, the buffers are freed by destroy() only (collective), else when the Buffer is
                garbage-collected.
            enable_shrink: the low-latency mode's shrink mode: a rank that stops answering is masked instead of
                failing the calls (low_latency_*_mask_buffer).
            comm: an mpi4py communicator in place of `group` (used only when `group` is None, as DeepEP): the
                setup's collectives go through its allgather and Barrier; `self.group` is then None.
            timeout_s (ep_rt): how long a kernel or host wait waits for a peer before raising CommTimeoutError;
                default EP_RT_TIMEOUT_S (100 s). Internode waits use EP_RT_NET_TIMEOUT_S (default 3 x this).

        ep_rt: nodes are found by host name (or EP_RT_RANKS_PER_NODE, which emulates nodes on one host), not by
        `rank // 8`; NVSHMEM is initialised by ep_rt itself from Python, so there is no separate sync() step, and
        the NVSHMEM environment a Buffer needs is set (and checked against what the environment already says) by
        ep_rt.transport.network_settings."""
        self._parts = []  # transports, in construction order; destroyed in reverse (see _release)
        self._nvl = self._ll = self._ht = self._layout = self._modes = None
        self.destroyed = False
        over_comm = group is None and comm is not None
        if over_comm:
            collective.check_communicator(comm)
        else:
            validate.process_group(group)
        buffer_plan.check_arguments(num_nvl_bytes, num_rdma_bytes, low_latency_mode, num_qps_per_rank, use_fabric)
        validate.cuda_available()
        # (the communicator's first collective, every rank's COMM_WORLD number, after the local checks, as a group's
        # first collective is)
        members = collective.MpiGroup(comm) if over_comm else group
        self.num_qps_per_rank = num_qps_per_rank
        self.rank = collective.rank(members)
        self.group = group
        self.group_size = collective.size(members)
        self._members = members  # the group's collectives: `group`, or `comm` wrapped (transport.collective)
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self.device_index = torch.cuda.current_device()
        self.device = torch.device("cuda", self.device_index)
        driver.ensure_context(self.device_index)
        self._context_device = self.device_index  # other threads make it current at their first call
        call_guard.mark_context_bound(self.device_index)
        if low_latency_mode:  # before anything is allocated: an sm_80 GPU has no LL kernels
            from .ops.low_latency import LowLatencyOp

            LowLatencyOp.require_arch(driver.compute_capability(self.device_index))
        self.comm_stream = torch.cuda.Stream(device=self.device, priority=-1)
        timeout = buffer_plan.timeout_of(timeout_s, env.timeout_s)

        self.topology = topo = Topology.gather(members, driver.pci_bus_id(self.device_index))
        # Before the first collective allocation: every rank's local preparation (the plan included), and the inputs
        # that decide sizes, layouts, modes and the NVSHMEM world, compared over the group (raises on every rank if
        # they differ or any rank failed; transport.agreement).
        args = dict(
            num_nvl_bytes=num_nvl_bytes,
            num_rdma_bytes=num_rdma_bytes,
            low_latency_mode=low_latency_mode,
            num_qps_per_rank=num_qps_per_rank,
            allow_nvlink_for_low_latency_mode=allow_nvlink_for_low_latency_mode,
            allow_mnnvl=allow_mnnvl,
            enable_shrink=enable_shrink,
        )
        shared = agreement.buffer_values(args, topo)
        shared["EP_RT_TOPK_IDX_BITS (ep_rt.topk_idx_t)"] = str(validate.topk_idx_t)
        setup = agreement.exchange(members, shared, lambda: self._prepare(members, topo, timeout, **args))
        self._plan = plan = setup.plan
        try:
            self._build(plan, setup, members, topo, num_nvl_bytes)
        except BaseException:  # an error, a peer that never came, Ctrl-C: the caller never gets this Buffer
            self._abandon_construction()
            raise

    def _build(self, plan, setup, group, topo, num_nvl_bytes) -> None:
        """The plan, executed: transports, then ops (each part owned as soon as it exists, see _own)."""
        self._errors = self._own(ErrorRecords())
        self._session = self._shared_sym = None
        if plan.nvl_buffer:  # the NVL buffer of my node (also the device barrier)
            topo.require_nvlink(group)
            self._nvl = self._own(
                NvlBuffer(
                    group,
                    topo,
                    num_nvl_bytes,
                    self.device_index,
                    plan.timeout_s,
                    self._errors,
                    teardown_stream=self.comm_stream,
                )
            )
            self._layout = LayoutOp(
                self.device_index, driver.multiprocessor_count(self.device_index), self._errors, self.rank
            )
            self._nvl.barrier(self.comm_stream)
        if plan.ht is not None:
            self._ht = _HT_OPS[plan.ht](self, topo, setup)
        if plan.low_latency:
            self._ll = self._low_latency_op(topo, setup)
        if plan.shared_symmetric:  # the barrier between a call of one mode and the other's
            self._modes = ModeSwitch(self._ll, self.comm_stream)

    def _own(self, part):
        self._parts.append(part)
        return part

    def _abandon_construction(self) -> None:
        """Free what a failed construction made, without collectives (the peers may be anywhere in theirs), so no
        IPC mapping, host page or NVSHMEM registration outlives it and a new Buffer can be made; the first error of
        the teardown is added to the construction's, never raised over it."""
        import sys

        error = sys.exc_info()[1]
        try:
            self._release(collective=False)
        except Exception as e:  # noqa: BLE001 (the construction's own error is what the caller must see)
            if error is not None and hasattr(error, "add_note"):
                error.add_note(f"ep_rt: freeing the partly built Buffer also failed: {type(e).__name__}: {e}")

    def _prepare(
        self,
        group,
        topo,
        timeout,
        num_nvl_bytes,
        num_rdma_bytes,
        low_latency_mode,
        num_qps_per_rank,
        allow_nvlink_for_low_latency_mode,
        allow_mnnvl,
        enable_shrink,
    ):
        """This rank's part of the setup that can fail on its own (run inside agreement.exchange, so a failure is
        raised on every rank): the plan (buffer_plan), its cubins, and the NVSHMEM environment and world it would
        use. Returns (values every rank must share, the setup)."""
        from .ops.internode import InternodeOp

        plan = buffer_plan.plan(
            topo.num_ranks,
            topo.num_nodes,
            topo.describe(),
            num_nvl_bytes,
            num_rdma_bytes,
            low_latency_mode,
            allow_nvlink_for_low_latency_mode,
            self.explicitly_destroy,
            enable_shrink,
            timeout,
            getattr(InternodeOp, "supports_rail_world", False),
        )
        setup = _Setup(plan)
        if not plan.cubins:
            return {}, setup
        from .transport import nvshmem, nvshmem_world

        flavour = nvshmem.host_flavour()
        for family in plan.cubins:
            setup.entries[family] = _CUBINS[family](self.device_index, flavour)
        worlds = {buffer_plan.FULL: nvshmem_world.full_world, buffer_plan.RAIL: nvshmem_world.rail_world}
        first = setup.entries[plan.first_session_family]  # the first to open the session
        setup.nvshmem = nvshmem.prepare(
            group,
            topo,
            worlds[plan.nvshmem_world](topo),
            first["nvshmem"],
            num_qps_per_rank,
            plan.nvshmem_allow_nvlink,
            allow_mnnvl,
        )
        for entry in setup.entries.values():
            nvshmem.check_compatible(entry["nvshmem"], setup.nvshmem.plan.ibgda_peers)
        return setup.nvshmem.shared_values(), setup

    @property
    def runtime(self) -> DeepEPRuntime:
        """DeepEP's C++ runtime object (`buffer.runtime`): the methods Python code calls on it (node counts and ranks,
        availability, the local device and IPC handle, the comm stream, get_local_buffer_tensor, the low-latency
        clean and mask calls), answered from this Buffer (ep_rt.deep_ep_runtime). Calls ep_rt has no use for
        (sync, the C++ data-path calls) raise NotImplementedError naming what to call instead."""
        return DeepEPRuntime(self)

    def _nvshmem(self, topo, setup, kind):
        """The Buffer's one NVSHMEM session (LL and internode HT share the world), and `kind`'s module in it."""
        from .transport.nvshmem import NvshmemSession

        if self._session is None:
            self._session = self._own(NvshmemSession(self._members, setup.nvshmem, topo))
            self.nvshmem_qp_depth = self._session.qp_depth
        module = modules.load_entry(self.device_index, setup.entries[kind])
        self._session.register(module)
        return self._session, module

    def _internode_op(self, topo, setup):
        from .ops.internode import InternodeOp

        net_timeout = env.net_timeout_s(setup.plan.timeout_s)  # plan.internode_deadline: the network's
        session, module = self._nvshmem(topo, setup, buffer_plan.INTERNODE)
        sym = self._symmetric(session, topo, buffer_plan.INTERNODE)
        op = self._own(
            InternodeOp(
                topo,
                sym,
                self._nvl,
                module,
                self.num_rdma_bytes,
                self.device_index,
                net_timeout,
                self._errors,
                pe_base=sym.pe_base,
                pe_stride=sym.pe_stride,
                qp_rule_num_qps=self.num_qps_per_rank if session.plan.ibgda_peers else None,
            )
        )
        # Every rank's buffers are zeroed and registered before any kernel runs; ranks reach this after NVSHMEM's
        # start, which may take them different times (not a fault: a longer deadline than the network's).
        op.barrier(self.comm_stream, timeout_s=max(net_timeout, 120.0))
        return op

    def _low_latency_op(self, topo, setup):
        from .ops.low_latency import LowLatencyOp

        session, module = self._nvshmem(topo, setup, buffer_plan.LOW_LATENCY)
        sym = self._symmetric(session, topo, buffer_plan.LOW_LATENCY)
        return LowLatencyOp(
            topo,
            sym,
            module,
            self.num_rdma_bytes,
            self.device_index,
            setup.plan.timeout_s,
            self._errors,
            self.enable_shrink,
            control_start=buffer_memory.shared_symmetric_layout(self.num_rdma_bytes, topo.num_ranks, topo.num_nodes)[0]
            if setup.plan.shared_symmetric
            else None,
            allow_nvlink=setup.plan.nvshmem_allow_nvlink,
        )

    def _symmetric(self, session, topo, family: str):
        """The symmetric buffer of `family`'s op: its own, or (plan.shared_symmetric) the one both modes share,
        allocated when the first op asks: num_rdma_bytes of payload, then the internode op's control area, then
        the LL op's (they never overlap; ops/mode_switch.py guards the payload)."""
        from .ops.internode import InternodeOp
        from .ops.low_latency import LowLatencyOp
        from .transport.symmetric import SymmetricBuffer

        R, N = topo.num_ranks, topo.num_nodes
        if self._plan.shared_symmetric:
            if self._shared_sym is None:
                self._shared_sym = self._own(
                    SymmetricBuffer(
                        session,
                        buffer_memory.shared_symmetric_layout(self.num_rdma_bytes, topo.num_ranks, topo.num_nodes)[1],
                        R,
                        error_slot=(buffer_plan.INTERNODE, buffer_plan.LOW_LATENCY),
                    )
                )
            return self._shared_sym
        nbytes = (
            InternodeOp.symmetric_bytes(self.num_rdma_bytes, R, N)
            if family == buffer_plan.INTERNODE
            else LowLatencyOp.symmetric_bytes(self.num_rdma_bytes, R)
        )
        return self._own(SymmetricBuffer(session, nbytes, R, error_slot=family))

    # ---- lifetime -------------------------------------------------------------------------------
    @call_guard.one_at_a_time(None)
    def destroy(self) -> None:
        """Free every buffer of this Buffer, collectively; only for Buffers made with explicitly_destroy=True (as
        DeepEP). Every rank must call it. Idempotent: a second call does nothing.

        ep_rt: every wait of the teardown has a deadline; a part whose peers may be gone (a timeout, a masked rank)
        is freed without collectives, so destroy() returns on the ranks that are left. Any later call raises
        EpRtError ("destroyed")."""
        if not self.explicitly_destroy:
            raise EpRtError(
                "destroy() is for Buffers created with explicitly_destroy=True; others are "
                "released when garbage-collected"
            )
        self._release(collective=True)

    def _release(self, collective: bool) -> None:
        """Destroy the transports in reverse order of construction. A part whose kernels failed (its peers may be
        anywhere) is destroyed without collectives, as is everything from a finalizer (buffer_plan's rules)."""
        if self.destroyed:
            return
        self.destroyed = True
        nvshmem_users = [
            op for op in (self._ll, self._ht if self._plan.ht == buffer_plan.INTERNODE else None) if op is not None
        ]
        self._ll = self._ht = self._layout = self._nvl = None
        errors, interrupt, nvshmem_collective = [], None, False

        def note(e: BaseException) -> None:  # an interrupt (Ctrl-C, SIGTERM's SystemExit) makes the rest local
            nonlocal interrupt, collective, nvshmem_collective
            if isinstance(e, Exception):
                errors.append(e)
                return
            interrupt, collective, nvshmem_collective = interrupt or e, False, False
            settle_after_interrupt(self.device)  # the interrupted barrier's kernel ends before its memory is freed

        try:  # our own kernels first (every wait they make has a deadline, so this returns)
            torch.cuda.synchronize(self.device)
        except Exception as e:  # a finalizer at interpreter exit: the driver may be gone
            errors.append(e)
            collective = False
        except BaseException as e:
            note(e)
        # NVSHMEM's teardown is collective without a deadline: go there only once a barrier with one has seen every
        # peer arrive (mask-aware for LL), and never in shrink mode: a rank's masks are its own view (a peer may have
        # masked us while we masked nobody), and every rank must make the same choice.
        # A peer that timed out already (CommTimeoutError recorded) is not waited for again: its survivors tear
        # down locally at once. The peers that are still here then fail their barrier within its deadline and do
        # the same, so every rank makes the same choice.
        try:
            nvshmem_collective = (
                collective
                and not (nvshmem_users and self._errors.peer_may_be_gone())
                and self._nvshmem_users_met(nvshmem_users)
                and not self._plan.nvshmem_teardown_local
            )
        except BaseException as e:
            note(e)
        parts, self._parts = self._parts, []
        for part in reversed(parts):  # every part is freed, an interrupt or not; after one, without collectives
            part_collective = buffer_plan.part_destroy_collective(
                part.error_slot, collective, nvshmem_collective, lambda slot: self._errors.check(slot) is not None
            )
            try:
                part.destroy(part_collective)
            except BaseException as e:  # keep freeing the rest; report the first failure
                note(e)
        if interrupt is not None:
            raise interrupt
        if errors:
            raise errors[0]

    def _nvshmem_users_met(self, ops) -> bool:
        """Each NVSHMEM user's barrier with a deadline, unless it failed already; True if every one passed. A barrier
        that times out is no failure of destroy() (the peer is gone, as the caller's last call said, or will say):
        this rank's buffers are freed without NVSHMEM's collective teardown, and a warning says so."""
        met = True
        for op in ops:
            if op.failed is None:
                try:
                    op.barrier(self.comm_stream)
                except EpRtError as e:
                    warnings.warn(
                        f"ep_rt.Buffer.destroy(): {e} This rank's buffers were freed without NVSHMEM's collective "
                        f"teardown, which would wait for the missing peer; NVSHMEM stays initialised in this process "
                        f"(restart every process of the group to use low-latency or internode mode again).",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            met = met and op.failed is None
        return met

    def __del__(self):
        if getattr(self, "destroyed", True) or not getattr(self, "_parts", None):
            return
        if self.explicitly_destroy:
            warnings.warn("ep_rt.Buffer created with explicitly_destroy=True was not destroyed; call destroy()")
            return
        try:
            self._release(collective=False)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass

    def _live(self) -> NvlBuffer:
        if self.destroyed:
            raise EpRtError("this Buffer has been destroyed")
        if self._ht is None:
            raise EpRtError(
                f"this Buffer has no high-throughput mode ({self.topology.describe()}, low_latency_mode "
                f"without an NVL buffer): create it with num_nvl_bytes > 0 for high-throughput calls"
            )
        self._nvl.raise_if_failed()
        self._ht.raise_if_failed()
        return self._nvl

    def _ll_live(self):
        if self.destroyed:
            raise EpRtError("this Buffer has been destroyed")
        if self._ll is None:
            raise EpRtError("low-latency calls need Buffer(..., low_latency_mode=True, num_rdma_bytes=...)")
        self._ll.raise_if_failed()
        return self._ll

    def raise_if_failed(self) -> None:
        """ep_rt extension: raise the error a finished kernel recorded (CommTimeoutError for a peer that never came,
        KernelError for a bad expert id, BufferTooSmallError...), if there is one. Every call checks this on entry;
        call it after synchronising to learn about the last call at once."""
        if not self.destroyed:
            self._errors.raise_if_failed()

    def _raise_input_errors(self) -> None:
        """At the end of a high-throughput call (every kernel of it launched, so the peers' calls complete): raise a
        bad expert id that the layout family's check recorded, if the host can see it yet (no sync: a dispatch that
        waited for its receive counts sees its own; otherwise a later call's end, or raise_if_failed, reports it)."""
        if not torch.cuda.is_current_stream_capturing():  # (re-arming it synchronises: not inside a capture)
            self._errors.raise_if_failed(INPUT_SLOT)

    # ---- ep_rt extensions: what the argument checks and the benchmarks read, and the benchmarks' hooks -----------
    @property
    def is_internode(self) -> bool:
        """ep_rt extension: True when the high-throughput calls run the internode kernels (ranks on several nodes,
        num_rdma_bytes > 0); False on one node, for a low-latency-only Buffer, and once destroyed. DeepEP tells
        this case by `runtime.get_num_rdma_ranks() > 1`."""
        return bool(getattr(self._ht, "is_internode", False))

    @property
    def ht_serial(self) -> Optional[int]:
        """ep_rt extension: the serial number of this Buffer's high-throughput op, which the handles of its dispatch
        carry as their owner (ep_rt.handles.HandleFacts): combine and cached dispatch refuse a handle that another
        Buffer made. None without a high-throughput mode."""
        return None if self._ht is None else self._ht.serial

    @property
    def low_latency_variant(self) -> Optional[str]:
        """ep_rt extension: the variant of the low-latency cubin this Buffer loaded ("default"; "packed" with
        EP_RT_LL_PACKED=1; "chaos", "packed_chaos" under the test transport), what a benchmark records beside its
        numbers. None without a low-latency mode, and once destroyed."""
        return None if self._ll is None else self._ll.module.entry["variant"]

    def set_kernel_timer(self, timer) -> None:
        """Benchmark hook (ep_rt.testing.bench), not DeepEP API: time this Buffer's high-throughput kernels.

        Arguments:
            timer: a testing.bench.KernelTimer: every high-throughput kernel this Buffer launches then runs as
                `timer.around(kernel name, stream, launch)`, and the internode kernels start only after the kernel
                before them (no early launches); None: normal launches again."""
        if self._ht is None:
            raise EpRtError("set_kernel_timer: this Buffer has no high-throughput mode")
        self._ht.timer = timer

    def network_operation_counts(self, reset: bool = False) -> Optional[dict]:
        """Benchmark hook (ep_rt.testing.bench), not DeepEP API: the network operations this Buffer's NVSHMEM-linked
        kernels issued since the counters were last zeroed, as the chaos transport's cost mode counts them
        (EP_RT_CHAOS_TRANSPORT=1; docs/CHAOS_TRANSPORT.md): {"internode": counts, "low_latency": counts} for the
        ops this Buffer has, each a dict of put_signals, signals, quiets, fences, bytes and charged_ns (the sweep
        time charged to the quiets and fences). None with the normal cubins (they count nothing), for a Buffer
        without network kernels, and once destroyed. Reading synchronises the device: never inside a timed region.

        Arguments:
            reset: zero the counters once read (a benchmark zeroes them before the calls it counts)."""
        ops = {"internode": self._ht, "low_latency": self._ll}
        stats = {name: getattr(op, "net_stats", None) for name, op in ops.items()}
        stats = {name: s for name, s in stats.items() if s is not None}
        if not stats:
            return None
        counts = {name: s.read() for name, s in stats.items()}
        if reset:
            for s in stats.values():
                s.reset()
        return counts

    @call_guard.one_at_a_time(call_guard.NVL)
    def nvl_barrier(self, stream: torch.cuda.Stream, synchronize: bool = True) -> None:
        """Benchmark hook, not DeepEP API: the device barrier of this node's ranks over the NVL buffer, with the
        Buffer's timeout; every rank of the node must call it.

        Arguments:
            stream: the stream to run it on.
            synchronize: also wait for it on the host and raise what it recorded; False only enqueues it (the
                benchmarks line the GPUs up with it before a timed call)."""
        if self._nvl is None:
            raise EpRtError("nvl_barrier: this Buffer has no NVL buffer")
        self._nvl.barrier(stream, synchronize)

    @call_guard.one_at_a_time(call_guard.HT)
    def internode_barrier(self, stream: torch.cuda.Stream) -> None:
        """Benchmark hook, not DeepEP API: every rank of the group meets in the internode kernels' barrier (the
        network deadline, EP_RT_NET_TIMEOUT_S) and the host waits for it; raises CommTimeoutError naming a missing
        peer. Only on a Buffer whose high-throughput calls are internode (is_internode).

        Arguments:
            stream: the stream to run it on."""
        if not self.is_internode:
            raise EpRtError("internode_barrier needs a Buffer whose ranks span several nodes")
        self._ht.barrier(stream)

    # ---- small static API -----------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        """Whether the shipped cubins include sm_90 (Hopper) builds (the low-latency kernels need sm_90). DeepEP:
        whether its extension was compiled for SM90.

        ep_rt: read from the cubin manifest (cubins/manifest.json); False when the manifest cannot be found."""
        try:
            return any(e["arch"] == "sm_90" for e in modules.manifest()["cubins"])
        except EpRtError:
            return False

    @classmethod
    def set_num_sms(cls, new_num_sms: int) -> None:
        """Set the SM count the high-throughput configs use (Buffer.num_sms, class-wide, as DeepEP).

        Arguments:
            new_num_sms: a positive even number (DeepEP's rule; ep_rt's calls run config.num_sms channels, so this
                is also the channel count of the configs get_dispatch_config / get_combine_config return)."""
        if not isinstance(new_num_sms, int) or new_num_sms <= 0 or new_num_sms % 2:
            raise ValueError(f"num_sms must be a positive even int, got {new_num_sms!r}")
        cls.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """Record a CUDA event on the current stream (`torch.cuda.current_stream()`).

        Returns:
            event: an EventOverlap holding it, to pass as `previous_event` to a later call."""
        return EventOverlap(EventHandle())

    @staticmethod
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        """The smallest RDMA buffer (num_rdma_bytes) for low-latency calls of this shape, sized for BF16 combines.

        Arguments:
            num_max_dispatch_tokens_per_rank: the most tokens one rank dispatches in one call (the same on every rank).
            hidden: the hidden size of a token.
            num_ranks: the number of ranks in the group.
            num_experts: the number of experts over all ranks.

        Returns:
            size: the size in bytes.

        ep_rt: DeepEP's formula, the same whatever the node size (every peer has its own slots); ep_rt adds its own
        control area after num_rdma_bytes, so the caller's bytes are all usable. With EP_RT_LL_PACKED=1 the size
        of the packed layout (receive areas sized by what can arrive; at most DeepEP's formula for hidden sizes that are
        multiples of 512)."""
        from .transport.ll_layout import rdma_size_hint

        return rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts, env.ll_packed())

    @staticmethod
    def get_dispatch_config(num_ranks: int, *, num_ranks_per_node: Optional[int] = None) -> Config:
        """A recommended Config for dispatch over `num_ranks` ranks.

        Arguments:
            num_ranks: the number of ranks.
            num_ranks_per_node (ep_rt): the node size the config is for; without it config.ranks_per_node's rule
                (EP_RT_RANKS_PER_NODE, else torchrun's LOCAL_WORLD_SIZE where it fits the group, else one node
                up to 8 ranks, else nodes of 8 as DeepEP where 8 divides num_ranks, else of the largest of 4, 2, 1
                that does). dispatch(config=None) passes the Buffer's own node size.

        Returns:
            config: the Config.

        ep_rt: a config from EP_RT_CONFIG_FILE (`python -m ep_rt tune`) wins when it holds one for num_ranks (its
        num_sms included: the file says what was measured); else DeepEP's row where DeepEP has one, and a default
        elsewhere (ep_rt.config_tables), with Buffer.num_sms. Any positive rank count gets a Config (DeepEP asserts on
        rank counts outside its table); only a stated node size (num_ranks_per_node, EP_RT_RANKS_PER_NODE) that does
        not divide it raises ValueError. Of a Config, ep_rt's intranode kernels use num_sms only."""
        tuned = config_file.lookup("dispatch", num_ranks)
        return (
            tuned
            if tuned is not None
            else config_mod.table_config("dispatch", num_ranks, Buffer.num_sms, num_ranks_per_node)
        )

    @staticmethod
    def get_combine_config(num_ranks: int, *, num_ranks_per_node: Optional[int] = None) -> Config:
        """A recommended Config for combine over `num_ranks` ranks; as get_dispatch_config.

        Arguments:
            num_ranks: the number of ranks.
            num_ranks_per_node (ep_rt): the node size, as in get_dispatch_config.

        Returns:
            config: the Config.

        ep_rt: combine runs on the channels of the dispatch that made its handle, so this Config's num_sms does not
        change what a combine does (combine(config=None) looks nothing up)."""
        tuned = config_file.lookup("combine", num_ranks)
        return (
            tuned
            if tuned is not None
            else config_mod.table_config("combine", num_ranks, Buffer.num_sms, num_ranks_per_node)
        )

    def get_comm_stream(self) -> torch.cuda.Stream:
        """The communication stream: the high-throughput and layout calls, and the low-latency calls without a
        receive hook, run on it (DeepEP's).

        Returns:
            stream: a torch.cuda.Stream of this Buffer's device (high priority)."""
        return self.comm_stream

    def get_local_buffer_tensor(
        self, dtype: torch.dtype, size: Optional[torch.Size] = None, offset: int = 0, use_rdma_buffer: bool = False
    ) -> torch.Tensor:
        """A view of this rank's own communication buffer as a tensor (no copy).

        Arguments:
            dtype: the tensor's torch.dtype.
            size: the shape to view (its element count must fit); None: 1-D, to the buffer's end.
            offset: where the view starts, in bytes (as DeepEP's C++ takes it).
            use_rdma_buffer: the RDMA (symmetric) buffer's num_rdma_bytes instead of the NVL buffer.

        Returns:
            tensor: the view.

        ep_rt: the NVL view is the buffer's data region (ep_rt's control region comes first in the allocation and is
        not part of it); the view stops at the buffer's end where DeepEP's runs past it by `offset`; an offset or
        size that does not fit raises ValueError."""
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise TypeError(f"offset must be an int (bytes), got {offset!r}")
        if use_rdma_buffer:
            if self.destroyed:
                raise EpRtError("this Buffer has been destroyed")
            owner = self._ll if self._ll is not None else (self._ht if self.is_internode else None)
            if owner is None:
                raise ValueError(
                    "use_rdma_buffer=True needs a Buffer with num_rdma_bytes > 0 (low_latency_mode=True, "
                    "or ranks on several nodes)"
                )
            raw = owner.rdma_tensor()
        else:
            raw = self._live().data_tensor()
        if not 0 <= offset <= raw.numel():
            raise ValueError(f"offset {offset} is outside the {raw.numel()}-byte buffer")
        elem = torch.empty((), dtype=dtype).element_size()
        usable = (raw.numel() - offset) // elem * elem
        view = raw[offset : offset + usable].view(dtype)
        if size is not None:
            size = torch.Size(size)
            if size.numel() > view.numel():
                raise ValueError(f"size {tuple(size)} needs {size.numel()} elements; the buffer has {view.numel()}")
            view = view[: size.numel()].view(size)
        return view

    # ---- layout ---------------------------------------------------------------------------------
    @call_guard.one_at_a_time(None)
    def get_dispatch_layout(
        self,
        topk_idx: torch.Tensor,
        num_experts: int,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """Count, from the top-k routing, what a dispatch sends: tokens per rank, per node and per expert, and which
        ranks each token goes to.

        Arguments:
            topk_idx: `[num_tokens, num_topk]` int64 (or int32, ep_rt.topk_idx_t), the experts each token selected;
                -1: no selection.
            num_experts: the number of experts over all ranks (a multiple of the rank count).
            previous_event: an EventOverlap the comm stream waits for before the kernel runs.
            async_finish: if set, the current stream does not wait for the kernel; wait on the returned event.
            allocate_on_comm_stream: allocate the outputs on the comm stream (their memory belongs to it).

        Returns:
            num_tokens_per_rank: `[num_ranks]` int32, the tokens this rank sends to each rank.
            num_tokens_per_rdma_rank: `[num_nodes]` int32, the tokens sent to each node; None on one node.
            num_tokens_per_expert: `[num_experts]` int32, the tokens sent to each expert.
            is_token_in_rank: `[num_tokens, num_ranks]` bool, whether a token goes to a rank.
            event: the event after the kernel (holds something only with async_finish).

        ep_rt: nodes are ep_rt's (Topology), so num_tokens_per_rdma_rank has one entry per node of the Buffer's
        node size, not per `rank // 8`."""
        self._live()
        validate.experts(num_experts, self.group_size)
        validate.topk_idx(topk_idx, self.device)
        scope = StreamScope(self.comm_stream, previous_event, async_finish, allocate_on_comm_stream)
        topo = getattr(self, "topology", None)
        G = topo.node_size if topo is not None and topo.num_nodes > 1 else 8
        per_rank, per_node, per_expert, in_rank, counts = self._layout(
            topk_idx, num_experts, self.group_size, scope.alloc_stream(), self.comm_stream, G
        )
        event = scope.finish([topk_idx, counts, in_rank])
        self._raise_input_errors()
        return per_rank, per_node, per_expert, in_rank, event

    # ---- dispatch -------------------------------------------------------------------------------
    @call_guard.one_at_a_time(call_guard.HT)
    def dispatch(
        self,
        x: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        handle: Optional[Tuple] = None,
        num_tokens_per_rank: Optional[torch.Tensor] = None,
        num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
        is_token_in_rank: Optional[torch.Tensor] = None,
        num_tokens_per_expert: Optional[torch.Tensor] = None,
        topk_idx: Optional[torch.Tensor] = None,
        topk_weights: Optional[torch.Tensor] = None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """Send each token to the ranks that hold its selected experts, within a node or across nodes (the internode
        kernels when the ranks span several nodes). Intranode, all ranks must reach each other over NVLink; across
        nodes, the ranks of a node over NVLink and each rank its peers of the same local index over the network.

        Arguments:
            x: `[num_tokens, hidden]` bf16, or an FP8 pair: `[num_tokens, hidden]` float8_e4m3fn and its scales,
                `[num_tokens, num_scales]` float32 (DeepEP's hidden // 128; any strides) or int32 (UE8M0 exponents,
                four per int32), which travel as they are. A row's bytes must be a multiple of 16.
            handle: a handle from an earlier dispatch of the same tokens: a cached dispatch, which reuses its layout
                (no counting, no host wait) and takes no topk_idx / topk_weights.
            num_tokens_per_rank: `[num_ranks]` int32, from get_dispatch_layout.
            num_tokens_per_rdma_rank: `[num_nodes]` int32, from get_dispatch_layout; checked, not needed (ep_rt's
                internode kernels derive the node counts); None on one node.
            is_token_in_rank: `[num_tokens, num_ranks]` bool, from get_dispatch_layout.
            num_tokens_per_expert: `[num_experts]` int32, from get_dispatch_layout; needed with or without top-k.
            topk_idx: `[num_tokens, num_topk]` int64 or int32, the selected experts (-1: none); None to send the
                tokens without routing data.
            topk_weights: `[num_tokens, num_topk]` float32, given together with topk_idx.
            expert_alignment: each local expert's received count is rounded up to a multiple of this.
            num_worst_tokens: if > 0, the outputs have this many rows whatever the routing, and the host does not
                wait for the receive count (needed inside CUDA-graph capture); rows past the received ones are
                unused (recv_topk_idx -1 there) and num_recv_tokens_per_expert_list is empty.
            config: the performance config; None: get_dispatch_config for this Buffer's ranks and node size.
            previous_event: an EventOverlap the comm stream waits for before the kernels run.
            async_finish: if set, the current stream does not wait for the kernels; wait on the returned event.
            allocate_on_comm_stream: allocate the outputs on the comm stream.

        Returns:
            recv_x: the received tokens, in the form of `x` (a tensor or an FP8 pair).
            recv_topk_idx: `[num_recv, num_topk]`, each received token's selections, as local expert indices (-1 for
                experts of other ranks); None without topk_idx or for a cached dispatch.
            recv_topk_weights: `[num_recv, num_topk]` float32, the matching weights; None likewise.
            num_recv_tokens_per_expert_list: a Python list, the tokens each local expert receives (aligned to
                expert_alignment); empty with num_worst_tokens; None for a cached dispatch.
            handle: the handle combine (and a cached dispatch) takes: DeepEP's 6-tuple intranode, its 10-tuple
                internode (ep_rt.handles); None for a cached dispatch.
            event: the event after the kernels (holds something only with async_finish).

        ep_rt: channels are config.num_sms (DeepEP: num_sms / 2), so the prefix matrices of the handle differ in
        their channel dimension; the handle's send positions are stream positions; a handle from another Buffer is
        refused. A call that does not fit the buffers raises BufferTooSmallError naming the size it needs, and bad
        input raises before any kernel runs."""
        self._live()
        if handle is None and num_worst_tokens == 0 and torch.cuda.is_current_stream_capturing():
            # Without num_worst_tokens the host must read the receive count to size the outputs: a sync.
            raise RuntimeError(
                "dispatch inside CUDA-graph capture needs num_worst_tokens > 0 (the output size "
                "must not depend on the routing), or a handle (cached dispatch)"
            )
        if config is None:  # this Buffer's own node size, not an assumed one
            config = self.get_dispatch_config(self.group_size, num_ranks_per_node=self.topology.node_size)
        args = ht_args.check(
            self,
            x,
            handle,
            num_tokens_per_rank,
            is_token_in_rank,
            num_tokens_per_expert,
            topk_idx,
            topk_weights,
            expert_alignment,
            num_worst_tokens,
            config,
        )
        call = DispatchCall(
            args.x,
            args.x_scales,
            handle,
            topk_idx,
            topk_weights,
            num_tokens_per_rank,
            num_tokens_per_rdma_rank,
            is_token_in_rank,
            num_tokens_per_expert,
            expert_alignment,
            num_worst_tokens,
            config.num_sms,
        )
        self._ht.check_dispatch(call)
        scope = StreamScope(self.comm_stream, previous_event, async_finish, allocate_on_comm_stream)
        if call.handle is None and call.topk_idx is not None:  # before the notify, on the comm stream: no host sync
            self._layout.check_ids(call.topk_idx, call.num_tokens_per_expert.numel(), self.comm_stream)
        if self._modes is not None:
            self._modes.before_high_throughput()
        r = self._ht.run_dispatch(call, scope.alloc_stream(), self.comm_stream)
        event = scope.finish(r.tensors)
        self._raise_input_errors()
        out_x = (r.recv_x, r.recv_x_scales) if r.recv_x_scales is not None else r.recv_x
        return out_x, r.recv_topk_idx, r.recv_topk_weights, r.num_recv_tokens_per_expert_list, r.handle, event

    # ---- combine --------------------------------------------------------------------------------
    @call_guard.one_at_a_time(call_guard.HT)
    def combine(
        self,
        x: torch.Tensor,
        handle: Tuple,
        topk_weights: Optional[torch.Tensor] = None,
        bias: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor], None] = None,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """Return each token's expert outputs to the rank it came from and sum them: the reverse of the dispatch that
        made `handle`, without top-k weighting (as DeepEP).

        Arguments:
            x: `[num_recv, hidden]` bf16, one row per token this rank received, in the dispatch's receive order.
            handle: the handle of that dispatch (a rebuilt plain tuple of the same tensors works too).
            topk_weights: `[num_recv, num_topk]` float32, summed per token like x; None: none returned.
            bias (ep_rt, as DeepEP's later releases): a `[num_tokens, hidden]` bf16 tensor or a pair of them, added
                to each token's sum.
            config: DeepEP's performance config; accepted and type-checked, but ep_rt's combine runs on the
                channels of the dispatch that made `handle`, so it changes nothing.
            previous_event: an EventOverlap the comm stream waits for before the kernels run.
            async_finish: if set, the current stream does not wait for the kernels; wait on the returned event.
            allocate_on_comm_stream: allocate the outputs on the comm stream.

        Returns:
            combined_x: `[num_tokens, hidden]` bf16, each token's sum over the ranks it was sent to.
            combined_topk_weights: `[num_tokens, num_topk]` float32, the summed weights; None without topk_weights.
            event: the event after the kernels (holds something only with async_finish).

        ep_rt: the sum runs in float32 in a fixed order (bias first, then the ranks in ascending order), so results
        are the same from call to call; ep_rt.reference.intranode_combine / internode_combine define them bit for
        bit."""
        self._live()
        bias0, bias1 = ht_args.check_combine(self, x, handle, topk_weights, bias, config)
        handle = self._ht.combine_handle(x, handle, topk_weights)
        scope = StreamScope(self.comm_stream, previous_event, async_finish, allocate_on_comm_stream)
        if self._modes is not None:
            self._modes.before_high_throughput()
        combined_x, combined_w, tensors = self._ht.combine(
            x, handle, topk_weights, bias0, bias1, scope.alloc_stream(), self.comm_stream
        )
        event = scope.finish(tensors)
        self._raise_input_errors()
        return combined_x, combined_w, event

    # ---- low latency --------------------------------------------------------------------------
    @call_guard.one_at_a_time(call_guard.LL)
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Zero the low-latency buffers' signal areas on every rank (collective).

        Arguments:
            num_max_dispatch_tokens_per_rank: the most tokens a rank dispatches in one call (the same on every rank).
            hidden: the hidden size.
            num_experts: the number of experts over all ranks.

        ep_rt: the signals carry per-call tags and, where both modes share the RDMA buffer (low_latency_mode with
        an NVL buffer across nodes), each switch of mode starts behind a barrier on the comm stream that ep_rt puts
        there itself, so eager calls need this neither between high-throughput and low-latency use (DeepEP needs it
        there) nor to return to a known state. A CUDA graph of low-latency calls replayed right after
        high-throughput calls on a shared buffer does need it (or one eager low-latency call) in between: a barrier
        is never captured. The shape is checked against the buffer."""
        self._ll_live().clean(num_max_dispatch_tokens_per_rank, hidden, num_experts)
        if self._modes is not None:
            self._modes.cleaned()

    @call_guard.one_at_a_time(call_guard.LL, hook=True)
    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
        dispatch_wait_recv_cost_stats: Optional[torch.Tensor] = None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ):
        """Send each token to the ranks of its selected experts, for decoding-size batches; the received tokens are
        laid out per local expert in fixed-size blocks, so no host sync is needed (CUDA-graph friendly). Two buffers
        alternate, so the call after the next one overwrites a call's outputs (hold at most two, as with DeepEP).

        Arguments:
            x: `[num_tokens, hidden]` bf16, at most num_max_dispatch_tokens_per_rank tokens; hidden a multiple of 128.
            topk_idx: `[num_tokens, num_topk]` int64 or int32, the selected experts (-1: none); top-k up to 16.
            num_max_dispatch_tokens_per_rank: the most tokens a rank dispatches in one call (the same on every rank).
            num_experts: the number of experts over all ranks.
            cumulative_local_expert_recv_stats: `[num_local_experts]` int32 or None; the tokens each local expert
                receives are added to it.
            dispatch_wait_recv_cost_stats: `[num_ranks]` int64 or None; the cycles the receive waited for each
                source rank are added to it.
            use_fp8: send FP8 (e4m3) with a scale per 128 channels; the received data is then a pair.
            round_scale: round the scales to powers of two.
            use_ue8m0: send the scales as UE8M0 exponents, four per int32 (needs round_scale and hidden % 512 == 0).
            async_finish: if set, the current stream does not wait for the kernels; wait on the returned event.
            return_recv_hook: if set, only the sending kernel runs now (on the current stream); calling the returned
                hook launches the receive, so other work can overlap the transfer.

        Returns:
            recv_x: `[num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, hidden]` bf16, or with use_fp8
                a pair of that shape in float8_e4m3fn and its scales, `[..., hidden // 128]` float32 (int32
                `[..., hidden // 512]` with use_ue8m0), column-major in the last two dimensions as DeepEP's. Only
                the first recv_count[e] rows of each expert are valid.
            recv_count: `[num_local_experts]` int32, the tokens each local expert received.
            handle: the handle low_latency_combine takes.
            event: the event after the kernels (holds something only with async_finish).
            hook: with return_recv_hook, the function that launches the receive; else None.

        ep_rt: peers on this node are reached over NVLink (allow_nvlink_for_low_latency_mode), others over the
        network, both through NVSHMEM; a rank that did not make the same call raises CommTimeoutError (in shrink
        mode it is masked instead); calls of different shapes from call to call need no clean_low_latency_buffer."""
        ll = self._ll_live()
        T = num_max_dispatch_tokens_per_rank
        ll.check_modes(async_finish, return_recv_hook)
        ll.check_queue_depth(T, self.nvshmem_qp_depth)
        args = (
            x,
            topk_idx,
            T,
            num_experts,
            cumulative_local_expert_recv_stats,
            dispatch_wait_recv_cost_stats,
            use_fp8,
            round_scale,
            use_ue8m0,
        )
        if self._modes is not None:
            self._modes.before_low_latency()
        outputs, event, hook = ll.run(
            lambda stream, split: ll.dispatch(*args, stream, split),
            async_finish,
            return_recv_hook,
            lambda out: [x, topk_idx, cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats, *out],
            self.comm_stream,
        )
        hook = self._tracked_hook(hook)
        recv_x, scales, count, src_info, layout_range = outputs
        handle = LowLatencyHandle(src_info, layout_range, T, x.size(1), num_experts)
        # HandleFacts.of(handle, ll.serial), without its pass over the entries (two tensors, then three ints)
        with_facts(handle, HandleFacts(ll.serial, (src_info.data_ptr(), layout_range.data_ptr(), 0, 0, 0)))
        return ((recv_x, scales) if use_fp8 else recv_x), count, handle, event, hook

    @call_guard.one_at_a_time(call_guard.LL, hook=True)
    def low_latency_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: tuple,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out: Optional[torch.Tensor] = None,
        combine_wait_recv_cost_stats: Optional[torch.Tensor] = None,
    ):
        """Return the experts' outputs of a low-latency dispatch to the ranks the tokens came from and sum them with
        the top-k weights (weighted, unlike combine).

        Arguments:
            x: `[num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, hidden]` bf16, the experts' outputs
                in the dispatch's receive layout.
            topk_idx: `[num_tokens, num_topk]`, the routing this rank passed to the dispatch.
            topk_weights: `[num_tokens, num_topk]` float32, the weights of that routing.
            handle: the handle of that dispatch.
            use_logfmt: send the rows LogFMT-10 encoded (10-bit log codes per 128-channel division, as DeepEP's;
                divisions it cannot encode travel as bf16).
            zero_copy: x is already in the send buffer (written through get_next_low_latency_combine_buffer); not with
                use_logfmt.
            async_finish: if set, the current stream does not wait for the kernels; wait on the returned event.
            return_recv_hook: as in low_latency_dispatch.
            out: a `[num_tokens, hidden]` bf16 tensor to write the result into; None: a new one.
            combine_wait_recv_cost_stats: `[num_ranks]` int64 or None; the cycles the receive waited for each rank
                are added to it.

        Returns:
            combined_x: `[num_tokens, hidden]` bf16, each token's weighted sum (float32 accumulation in top-k order).
            event: the event after the kernels (holds something only with async_finish).
            hook: with return_recv_hook, the function that launches the receive; else None.

        ep_rt: a handle made by another Buffer, or whose tensors were replaced, is refused (ValueError);
        ep_rt.reference.low_latency_combine defines the result bit for bit (with LogFMT, within the rounding of
        the GPU's approximate lg2 / ex2)."""
        ll = self._ll_live()
        if use_logfmt and zero_copy:
            raise ValueError(
                "use_logfmt and zero_copy cannot be used together (zero_copy rows are already in the "
                "send buffer as bf16; LogFMT encodes them on the way out)"
            )
        ll.check_modes(async_finish, return_recv_hook)
        typed = self._ll_handle(ll, handle, "low_latency_combine")
        src_info, layout_range, T, hidden, num_experts = typed
        # A handle that carries facts is the (immutable) tuple this Buffer's dispatch returned, checked against them
        # just now: its src_info is the dispatch's own tensor, so the packed layout's plane check has nothing to add.
        src_info_checked = getattr(typed, "facts", None) is not None
        args = (
            x,
            topk_idx,
            topk_weights,
            src_info,
            layout_range,
            T,
            hidden,
            num_experts,
            out,
            combine_wait_recv_cost_stats,
            zero_copy,
            use_logfmt,
        )
        if self._modes is not None:
            self._modes.before_low_latency()
        combined, event, hook = ll.run(
            lambda stream, split: ll.combine(*args, stream, split, src_info_checked),
            async_finish,
            return_recv_hook,
            lambda combined: [
                x,
                topk_idx,
                topk_weights,
                src_info,
                layout_range,
                combined,
                combine_wait_recv_cost_stats,
            ],
            self.comm_stream,
        )
        return combined, event, self._tracked_hook(hook)

    def _tracked_hook(self, hook):
        """With both modes in one symmetric buffer, a receive hook tells the mode switch where its kernel ran."""
        if hook is None or self._modes is None:
            return hook
        modes = self._modes

        def tracked():
            result = hook()
            modes.after_receive_hook()
            return result

        return tracked

    @staticmethod
    def _ll_handle(ll, handle, what: str) -> LowLatencyHandle:
        return as_handle(LowLatencyHandle, handle, what, owner=ll.serial)

    @call_guard.one_at_a_time(None)
    def get_next_low_latency_combine_buffer(self, handle: tuple) -> torch.Tensor:
        """The send buffer the next low-latency call reads, for a zero_copy combine: write the experts' outputs
        into it, then call low_latency_combine(..., zero_copy=True).

        Arguments:
            handle: the handle of the dispatch whose tokens will be combined.

        Returns:
            buffer: `[num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, hidden]` bf16, a strided view
                into the RDMA buffer (no copy)."""
        src_info, layout_range, T, hidden, num_experts = self._ll_handle(
            self._ll_live(), handle, "get_next_low_latency_combine_buffer"
        )
        # After high-throughput calls on the buffer both modes share, the caller's writes (on its current stream)
        # must follow the switch's barrier: taken here, not at the combine.
        if self._modes is not None and self._modes.before_low_latency():
            wait_stream(torch.cuda.current_stream(), self.comm_stream)  # (the comm stream's reused fence)
        return self._ll_live().next_combine_buffer(T, hidden, num_experts)

    def _shrink_mask(self) -> torch.Tensor:
        ll = self._ll_live()
        if ll.mask is None:
            raise EpRtError("mask buffers need Buffer(..., enable_shrink=True)")
        return ll.mask

    @call_guard.one_at_a_time(None)
    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Shrink mode (enable_shrink=True): mark a rank as masked, or unmask it. The low-latency calls skip masked
        ranks (they neither send to nor wait for them).

        Arguments:
            rank_to_mask: the rank, in [0, num_ranks).
            mask: True to mask it, False to unmask it.

        ep_rt: a rank that times out in a low-latency call is masked by the kernels themselves in shrink mode."""
        m = self._shrink_mask()
        if (
            not isinstance(rank_to_mask, int)
            or isinstance(rank_to_mask, bool)
            or not 0 <= rank_to_mask < self.group_size
        ):
            raise ValueError(f"rank_to_mask must be in [0, {self.group_size}), got {rank_to_mask}")
        m[rank_to_mask] = 1 if mask else 0

    @call_guard.one_at_a_time(None)
    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor) -> None:
        """Shrink mode: copy which ranks are masked into `mask_status`.

        Arguments:
            mask_status: `[num_ranks]` int32 on this device; 1 for a masked rank, 0 otherwise."""
        m = self._shrink_mask()
        validate.tensor("mask_status", mask_status, dtype=torch.int32, ndim=1, device=self.device, rows=self.group_size)
        mask_status.copy_(m)

    @call_guard.one_at_a_time(None)
    def low_latency_clean_mask_buffer(self) -> None:
        """Shrink mode: unmask every rank (this rank's view; each rank keeps its own)."""
        self._shrink_mask().zero_()

    # ---- DeepEP's internode entry points (its dispatch / combine route to them across nodes) ----------
    @call_guard.one_at_a_time(call_guard.HT)
    def internode_dispatch(
        self,
        x: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
        handle: Optional[Tuple] = None,
        num_tokens_per_rank: Optional[torch.Tensor] = None,
        num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
        is_token_in_rank: Optional[torch.Tensor] = None,
        num_tokens_per_expert: Optional[torch.Tensor] = None,
        topk_idx: Optional[torch.Tensor] = None,
        topk_weights: Optional[torch.Tensor] = None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """DeepEP's internode entry point: dispatch() on a Buffer whose ranks span several nodes; the arguments and
        results are dispatch()'s (see its docstring). dispatch() takes this path by itself, so callers need not
        call it; raises EpRtError on a Buffer whose high-throughput calls are not internode."""
        if not self.is_internode:
            raise EpRtError("internode_dispatch needs a Buffer whose ranks span several nodes")
        return self.dispatch(
            x,
            handle,
            num_tokens_per_rank,
            num_tokens_per_rdma_rank,
            is_token_in_rank,
            num_tokens_per_expert,
            topk_idx,
            topk_weights,
            expert_alignment,
            num_worst_tokens,
            config,
            previous_event,
            async_finish,
            allocate_on_comm_stream,
        )

    @call_guard.one_at_a_time(call_guard.HT)
    def internode_combine(
        self,
        x: torch.Tensor,
        handle: Union[tuple, list],
        topk_weights: Optional[torch.Tensor] = None,
        bias: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor], None] = None,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """DeepEP's internode entry point: combine() on a Buffer whose ranks span several nodes; the arguments and
        results are combine()'s (see its docstring). combine() takes this path by itself; raises EpRtError on a
        Buffer whose high-throughput calls are not internode."""
        if not self.is_internode:
            raise EpRtError("internode_combine needs a Buffer whose ranks span several nodes")
        return self.combine(
            x, handle, topk_weights, bias, config, previous_event, async_finish, allocate_on_comm_stream
        )


def _internode_cubin(device_index: int, flavour):
    return modules.choose_entry(modules.manifest(), "internode", device_index, env.aggressive_ptx(), flavour)


def _low_latency_cubin(device_index: int, flavour):
    from .ops.low_latency import LowLatencyOp

    return LowLatencyOp.cubin_entry(device_index, flavour)


# The NVSHMEM-linked cubin of each family a plan names (buffer_plan.BufferPlan.cubins).
_CUBINS = {buffer_plan.INTERNODE: _internode_cubin, buffer_plan.LOW_LATENCY: _low_latency_cubin}
# The high-throughput op of each plan.ht (ep_rt.ht_op.HighThroughputOp): adding a mode is one line here.
_HT_OPS = {
    buffer_plan.INTRANODE: lambda buf, topo, setup: IntranodeOp(buf._nvl),
    buffer_plan.INTERNODE: lambda buf, topo, setup: buf._internode_op(topo, setup),
}
