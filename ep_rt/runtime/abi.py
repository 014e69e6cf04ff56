"""ctypes mirrors of the kernel parameter structs and constants in kernels_src/include/ep_rt/params.h.

Hand-written: change this file together with params.h. tests/runtime/test_params.py compares every struct's
size, alignment and field offsets, and every constant, with what tools/build_cubins.py measured
from params.h (cubins/manifest.json). Device pointers are plain integers (c_uint64); 0 means absent.
Every struct is a Mirror with `__slots__ = ()`: assigning a name that is not one of its fields raises AttributeError
(plain ctypes would add an attribute, so a misspelt field would silently never reach the kernel).
"""

import ctypes
import difflib

EP_RT_MAX_NVL_RANKS = 8
EP_RT_MAX_CHANNELS = 128
EP_RT_MAX_LOCAL_EXPERTS = 1024
EP_RT_MAX_TOPK = 32

EP_RT_ERR_NONE = 0
EP_RT_ERR_TIMEOUT = 1
EP_RT_ERR_CAPACITY = 2
EP_RT_ERR_WORST_TOKENS = 3
EP_RT_ERR_MISMATCH = 4
EP_RT_ERR_BAD_EXPERT = 5

EP_RT_PHASE_BARRIER = 1
EP_RT_PHASE_NOTIFY = 2
EP_RT_PHASE_DISPATCH_HANDSHAKE = 3
EP_RT_PHASE_DISPATCH_RECV = 4
EP_RT_PHASE_COMBINE_HANDSHAKE = 5
EP_RT_PHASE_COMBINE_RECV = 6
EP_RT_PHASE_LL_DISPATCH_RECV = 7
EP_RT_PHASE_LL_COMBINE_RECV = 8
EP_RT_PHASE_LL_DISPATCH_SEND = 9
EP_RT_PHASE_LL_BUFFER_FREE = 10
EP_RT_PHASE_LL_BARRIER = 11
EP_RT_PHASE_LAYOUT_IDS = 20
EP_RT_PHASE_DISPATCH_IDS = 21

EP_RT_NOTIFY_SLOT_BYTES = 5120
EP_RT_NOTIFY_HIDDEN_BYTES = 2
EP_RT_NOTIFY_NUM_TOPK = 3
EP_RT_NOTIFY_NUM_CHANNELS = 4
EP_RT_NOTIFY_NUM_EXPERTS = 5
EP_RT_NOTIFY_NUM_TOKENS = 6
EP_RT_NOTIFY_RANK_COUNTS = 8
EP_RT_NOTIFY_CHANNEL_COUNTS = 16
EP_RT_NOTIFY_EXPERT_COUNTS = 144

EP_RT_CALL_BARRIER = 0
EP_RT_CALL_NOTIFY = 1
EP_RT_CALL_DISPATCH = 2
EP_RT_CALL_COMBINE = 3
EP_RT_CALL_KINDS = 4

EP_RT_HOST_NUM_RECV = 0
EP_RT_HOST_MAX_DISPATCH_ROWS = 1
EP_RT_HOST_MAX_COMBINE_ROWS = 2
EP_RT_HOST_TOKEN = 3
EP_RT_HOST_MAX_TOKENS = 4
EP_RT_HOST_EXPERT_COUNTS = 5
EP_RT_HOST_COUNTER_WORDS = 5 + EP_RT_MAX_LOCAL_EXPERTS

EP_RT_LL_MAX_SIGNALS = 65536
EP_RT_LL_MAX_TOKENS = 1024
EP_RT_LL_MAX_TOPK = 16
EP_RT_LL_MAX_HIDDEN = 16384
EP_RT_LL_WS_TICKETS = 0
EP_RT_LL_WS_EPOCH = 4
EP_RT_LL_WS_CLAIM = 6
EP_RT_LL_WS_ARRIVED = 8
EP_RT_LL_WS_ARRIVED_GEN = 10
EP_RT_LL_WS_COUNTERS = 16

# internode high-throughput mode
EP_RT_IN_MAX_RANKS = 256
EP_RT_IN_MAX_NODES = 64
EP_RT_IN_STREAM_CHUNKS = 8
EP_RT_IN_SLOT_HIDDEN_BYTES = 0
EP_RT_IN_SLOT_NUM_TOPK = 1
EP_RT_IN_SLOT_NUM_CHANNELS = 2
EP_RT_IN_SLOT_NUM_EXPERTS = 3
EP_RT_IN_SLOT_NUM_SCALES = 4
EP_RT_IN_SLOT_HEADER = 8
EP_RT_IN_WS_NOTIFY = 0
EP_RT_IN_WS_DISPATCH = 1
EP_RT_IN_WS_CACHED = 2
EP_RT_IN_WS_COMBINE = 3
EP_RT_IN_WS_BARRIER = 4
EP_RT_IN_WS_TICKET = 8
EP_RT_IN_WS_CLAIM = 16
EP_RT_IN_WS_SKIP = 17
EP_RT_IN_WS_DEFERRED = 18
EP_RT_IN_WS_WORDS = 32
EP_RT_IN_HS_CACHED = 0
EP_RT_IN_HS_COMBINE = 1
EP_RT_IN_HS_BARRIER = 2
EP_RT_IN_HS_KINDS = 3
EP_RT_IN_HOST_TOKEN = 0
EP_RT_IN_HOST_NUM_RECV = 1
EP_RT_IN_HOST_NUM_RDMA_RECV = 2
EP_RT_IN_HOST_MAX_STREAM = 3
EP_RT_IN_HOST_MAX_RECV = 4
EP_RT_IN_HOST_MAX_FWD = 5
EP_RT_IN_HOST_EXPERT_COUNTS = 8
EP_RT_IN_HOST_WORDS = 8 + EP_RT_MAX_LOCAL_EXPERTS
EP_RT_PHASE_IN_NOTIFY = 12
EP_RT_PHASE_IN_HANDSHAKE = 13
EP_RT_PHASE_IN_FORWARD = 14
EP_RT_PHASE_IN_RECV = 15
EP_RT_PHASE_IN_COMBINE_HANDSHAKE = 16
EP_RT_PHASE_IN_COMBINE_FORWARD = 17
EP_RT_PHASE_IN_COMBINE_REDUCE = 18
EP_RT_PHASE_IN_NOTIFY_RELAY = 19

_u64, _i64, _i32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32
_PeerBuffers = _u64 * EP_RT_MAX_NVL_RANKS


def field_names(struct_type: type) -> frozenset:
    """The field names of a ctypes struct type, its bases' included."""
    return frozenset(f[0] for cls in struct_type.__mro__ for f in cls.__dict__.get("_fields_", ()))


def unknown_field(struct_type: type, name: str) -> AttributeError:
    """The error for assigning `name`, which is no field of struct_type: it names the struct and the nearest fields."""
    fields = sorted(field_names(struct_type))
    near = difflib.get_close_matches(name, fields, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(n) for n in near)}?" if near else f"its fields: {', '.join(fields)}"
    return AttributeError(f"{struct_type.__name__} has no field {name!r} (kernels_src/include/ep_rt/params.h): {hint}")


class Mirror(ctypes.Structure):
    """Base of the mirrors. Each mirror declares `__slots__ = ()`, so its instances have no __dict__ and ctypes
    itself refuses a name that is not a field, at no cost to field writes (a Python __setattr__ would add about
    0.14 us to each, and the low-latency and internode calls write dozens per call). CPython's message names the
    struct; Launcher.set adds the nearest field names (unknown_field)."""

    __slots__ = ()


class ErrorRecord(Mirror):
    __slots__ = ()
    _fields_ = [
        ("code", _i32),
        ("phase", _i32),
        ("rank", _i32),
        ("peer", _i32),
        ("channel", _i32),
        ("pad", _i32),
        ("detail0", _i64),
        ("detail1", _i64),
    ]


class LayoutParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("topk_idx", _u64),
        ("num_tokens_per_rank", _u64),
        ("num_tokens_per_rdma_rank", _u64),
        ("num_tokens_per_expert", _u64),
        ("is_token_in_rank", _u64),
        ("num_tokens", _i32),
        ("num_topk", _i32),
        ("num_experts", _i32),
        ("num_ranks", _i32),
        ("tokens_per_block", _i32),
        ("topk_idx_bits", _i32),
        ("num_ranks_per_node", _i32),
        ("pad", _i32),
        ("error", _u64),
        ("error_claim", _u64),
        ("rank", _i32),
        ("error_phase", _i32),
    ]


class ControlLayout(Mirror):
    __slots__ = ()
    _fields_ = [
        ("notify_slots", _i64),
        ("barrier_flags", _i64),
        ("dispatch_ready", _i64),
        ("combine_ready", _i64),
        ("dispatch_done", _i64),
        ("combine_done", _i64),
        ("error_claim", _i64),
        ("call_seq", _i64),
        ("data", _i64),
        ("data_bytes", _i64),
    ]


class BarrierParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("peer_buffers", _PeerBuffers),
        ("error", _u64),
        ("ctrl", ControlLayout),
        ("timeout_ns", _i64),
        ("rank", _i32),
        ("num_ranks", _i32),
    ]


class NotifyParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("peer_buffers", _PeerBuffers),
        ("error", _u64),
        ("num_tokens_per_rank", _u64),
        ("num_tokens_per_expert", _u64),
        ("is_token_in_rank", _u64),
        ("send_pos", _u64),
        ("channel_prefix_matrix", _u64),
        ("rank_prefix_matrix", _u64),
        ("recv_channel_prefix_matrix", _u64),
        ("host_counters", _u64),
        ("ctrl", ControlLayout),
        ("host_token", _i64),
        ("timeout_ns", _i64),
        ("dispatch_row_bytes", _i64),
        ("combine_row_bytes", _i64),
        ("rank", _i32),
        ("num_ranks", _i32),
        ("num_tokens", _i32),
        ("num_channels", _i32),
        ("num_experts", _i32),
        ("expert_alignment", _i32),
        ("hidden_bytes", _i32),
        ("num_topk", _i32),
    ]


class DispatchRegion(Mirror):
    __slots__ = ()
    _fields_ = [
        ("x", _i64),
        ("scales", _i64),
        ("topk_idx", _i64),
        ("topk_weights", _i64),
        ("src_idx", _i64),
        ("capacity", _i64),
    ]


class DispatchParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("peer_buffers", _PeerBuffers),
        ("error", _u64),
        ("x", _u64),
        ("x_scales", _u64),
        ("topk_idx", _u64),
        ("topk_weights", _u64),
        ("send_pos", _u64),
        ("rank_prefix_matrix", _u64),
        ("recv_channel_prefix_matrix", _u64),
        ("recv_x", _u64),
        ("recv_x_scales", _u64),
        ("recv_topk_idx", _u64),
        ("recv_topk_weights", _u64),
        ("recv_src_idx", _u64),
        ("round_rpm", _u64),
        ("full_rpm", _u64),
        ("ctrl", ControlLayout),
        ("region", DispatchRegion),
        ("scale_token_stride", _i64),
        ("scale_hidden_stride", _i64),
        ("timeout_ns", _i64),
        ("rank", _i32),
        ("num_ranks", _i32),
        ("num_tokens", _i32),
        ("num_channels", _i32),
        ("hidden_bytes", _i32),
        ("num_scales", _i32),
        ("num_topk", _i32),
        ("num_local_experts", _i32),
        ("num_out_rows", _i32),
        ("fill_unused_rows", _i32),
        ("handshake", _i32),
        ("topk_idx_bits", _i32),
        ("recv_topk_idx_bits", _i32),
        ("round", _i32),
        ("token_offset", _i32),
        ("pad", _i32),
    ]


class CombineRegion(Mirror):
    __slots__ = ()
    _fields_ = [
        ("x", _i64),
        ("topk_weights", _i64),
        ("capacity", _i64),
    ]


class CombineParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("peer_buffers", _PeerBuffers),
        ("error", _u64),
        ("x", _u64),
        ("topk_weights", _u64),
        ("bias0", _u64),
        ("bias1", _u64),
        ("send_pos", _u64),
        ("rank_prefix_matrix", _u64),
        ("recv_channel_prefix_matrix", _u64),
        ("combined_x", _u64),
        ("combined_topk_weights", _u64),
        ("round_rpm", _u64),
        ("full_rpm", _u64),
        ("ctrl", ControlLayout),
        ("region", CombineRegion),
        ("timeout_ns", _i64),
        ("rank", _i32),
        ("num_ranks", _i32),
        ("num_tokens", _i32),
        ("num_channels", _i32),
        ("hidden", _i32),
        ("num_topk", _i32),
        ("num_in_rows", _i32),
        ("round", _i32),
    ]


class LowLatencyParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("x", _u64),
        ("topk_idx", _u64),
        ("topk_weights", _u64),
        ("peer_bases", _u64),
        ("sym_base", _u64),
        ("workspace", _u64),
        ("mask", _u64),
        ("error", _u64),
        ("recv_x", _u64),
        ("recv_x_scales", _u64),
        ("recv_src_info", _u64),
        ("recv_layout_range", _u64),
        ("recv_count", _u64),
        ("cumulative_stats", _u64),
        ("wait_stats", _u64),
        ("signal_off", _i64),
        ("send_off", _i64),
        ("recv_off", _i64),
        ("credit_off", _i64),
        ("arrival_off", _i64),
        ("barrier_seq", _i64),
        ("msg_bytes", _i64),
        ("timeout_ns", _i64),
        ("rank", _i32),
        ("num_ranks", _i32),
        ("num_tokens", _i32),
        ("max_tokens", _i32),
        ("hidden", _i32),
        ("num_topk", _i32),
        ("num_experts", _i32),
        ("buffer_idx", _i32),
        ("use_fp8", _i32),
        ("round_scale", _i32),
        ("use_ue8m0", _i32),
        ("zero_copy", _i32),
        ("has_remote_peers", _i32),
        ("use_logfmt", _i32),
        ("shape_digest", _i32),
        ("topk_idx_bits", _i32),
    ]


class InternodeLayout(Mirror):
    __slots__ = ()
    _fields_ = [
        ("stage", _i64),
        ("recv", _i64),
        ("cap", _i64),
        ("record_bytes", _i64),
        ("slot_bytes", _i64),
        ("notify_send", _i64),
        ("notify_recv", _i64),
        ("notify_words", _i64),
        ("dispatch_words", _i64),
        ("combine_words", _i64),
        ("hs_words", _i64),
        ("own_ready", _i64),
        ("end", _i64),
    ]


class InternodeNvlLayout(Mirror):
    __slots__ = ()
    _fields_ = [
        ("slot_bytes", _i64),
        ("slots", _i64),
        ("slot_flags", _i64),
        ("hs", _i64),
        ("pub", _i64),
        ("pub_flag", _i64),
        ("relay", _i64),
        ("ready", _i64),
        ("ready_prefix", _i64),
        ("records", _i64),
        ("records_bytes", _i64),
    ]


class InternodeParams(Mirror):
    __slots__ = ()
    _fields_ = [
        ("sym_base", _u64),
        ("nvl_peers", _u64 * EP_RT_MAX_NVL_RANKS),
        ("workspace", _u64),
        ("error", _u64),
        ("host_counters", _u64),
        ("scratch", _u64),
        ("consumed", _u64),
        ("x", _u64),
        ("x_scales", _u64),
        ("topk_idx", _u64),
        ("topk_weights", _u64),
        ("is_token_in_rank", _u64),
        ("num_tokens_per_expert", _u64),
        ("bias0", _u64),
        ("bias1", _u64),
        ("rdma_cpm", _u64),
        ("gbl_cpm", _u64),
        ("recv_rdma_cpm", _u64),
        ("recv_rdma_prefix", _u64),
        ("recv_gbl_cpm", _u64),
        ("recv_gbl_prefix", _u64),
        ("recv_src_meta", _u64),
        ("send_rdma_head", _u64),
        ("send_nvl_head", _u64),
        ("recv_x", _u64),
        ("recv_x_scales", _u64),
        ("recv_topk_idx", _u64),
        ("recv_topk_weights", _u64),
        ("combined_x", _u64),
        ("combined_topk_weights", _u64),
        ("lay", InternodeLayout),
        ("nvl", InternodeNvlLayout),
        ("scale_token_stride", _i64),
        ("scale_hidden_stride", _i64),
        ("host_token", _i64),
        ("net_timeout_ns", _i64),
        ("nvl_capacity_rows", _i64),
        ("rank", _i32),
        ("num_ranks", _i32),
        ("ranks_per_node", _i32),
        ("num_nodes", _i32),
        ("pe_base", _i32),
        ("pe_stride", _i32),
        ("num_tokens", _i32),
        ("num_channels", _i32),
        ("hidden_bytes", _i32),
        ("num_scales", _i32),
        ("num_topk", _i32),
        ("num_experts", _i32),
        ("expert_alignment", _i32),
        ("num_out_rows", _i32),
        ("num_fwd_rows", _i32),
        ("num_in_rows", _i32),
        ("cached", _i32),
        ("fill_unused", _i32),
        ("topk_idx_bits", _i32),
        ("recv_topk_idx_bits", _i32),
    ]
