// Kernel parameter structs: one per kernel, passed by value as the kernel's only argument.
// Host-includable (plain C types) so tools/build_cubins.py can record sizes and field offsets,
// which ep_rt/params.py mirrors with ctypes and a CPU test compares.
// Every pointer is a uint64_t device address; 0 means "absent".
#pragma once
#include <stdint.h>

#define EP_RT_MAX_NVL_RANKS 8
#define EP_RT_MAX_CHANNELS 128
#define EP_RT_MAX_LOCAL_EXPERTS 1024
#define EP_RT_MAX_TOPK 32

// Error record in host-mapped memory. The first failing block claims a device-memory word (host memory
// has no native atomics on PCIe hosts), fills the record, and writes `code` last.
#define EP_RT_ERR_NONE 0
#define EP_RT_ERR_TIMEOUT 1
#define EP_RT_ERR_CAPACITY 2
#define EP_RT_ERR_WORST_TOKENS 3
#define EP_RT_ERR_MISMATCH 4
#define EP_RT_ERR_BAD_EXPERT 5

// Phases named in error records (ep_rt/errors.py maps them to words).
#define EP_RT_PHASE_BARRIER 1
#define EP_RT_PHASE_NOTIFY 2
#define EP_RT_PHASE_DISPATCH_HANDSHAKE 3
#define EP_RT_PHASE_DISPATCH_RECV 4
#define EP_RT_PHASE_COMBINE_HANDSHAKE 5
#define EP_RT_PHASE_COMBINE_RECV 6
#define EP_RT_PHASE_LL_DISPATCH_RECV 7
#define EP_RT_PHASE_LL_COMBINE_RECV 8
#define EP_RT_PHASE_LL_DISPATCH_SEND 9
#define EP_RT_PHASE_LL_BUFFER_FREE 10
#define EP_RT_PHASE_LL_BARRIER 11
// The expert ids of get_dispatch_layout and of a dispatch, checked by the layout family (no host sync).
#define EP_RT_PHASE_LAYOUT_IDS 20
#define EP_RT_PHASE_DISPATCH_IDS 21

struct ErrorRecord {
    int32_t code;
    int32_t phase;
    int32_t rank;
    int32_t peer;
    int32_t channel;
    int32_t pad;
    int64_t detail0;
    int64_t detail1;
};

struct LayoutParams {
    uint64_t topk_idx;                  // int64 or int32 (topk_idx_bits) [num_tokens, num_topk], -1 = no expert
    uint64_t num_tokens_per_rank;       // int32 [num_ranks], zeroed by the caller
    uint64_t num_tokens_per_rdma_rank;  // int32 [num_ranks / 8] or 0, zeroed by the caller
    uint64_t num_tokens_per_expert;     // int32 [num_experts], zeroed by the caller
    uint64_t is_token_in_rank;          // bool [num_tokens, num_ranks]
    int32_t num_tokens;
    int32_t num_topk;
    int32_t num_experts;
    int32_t num_ranks;
    int32_t tokens_per_block;
    int32_t topk_idx_bits;              // 64 or 32: the width of topk_idx
    int32_t num_ranks_per_node;         // G: a node's ranks (num_tokens_per_rdma_rank has num_ranks / G entries)
    int32_t pad;
    // Where an expert id outside [-1, num_experts) is reported (the Buffer's "input" record; 0: not checked).
    uint64_t error;        // ErrorRecord* (host-mapped)
    uint64_t error_claim;  // int32* in device memory: the record's claim word
    int32_t rank;
    int32_t error_phase;   // EP_RT_PHASE_LAYOUT_IDS or EP_RT_PHASE_DISPATCH_IDS
};

// Buffer control region: offsets (bytes from each rank's buffer base), identical on every rank.
struct ControlLayout {
    int64_t notify_slots;       // [num_ranks src] NotifySlot-sized records of int32
    int64_t barrier_flags;      // int64 [MAX_NVL_RANKS]
    int64_t dispatch_ready;     // int64 [MAX_NVL_RANKS]
    int64_t combine_ready;      // int64 [MAX_NVL_RANKS]
    int64_t dispatch_done;      // int64 [MAX_NVL_RANKS][MAX_CHANNELS]
    int64_t combine_done;       // int64 [MAX_NVL_RANKS][MAX_CHANNELS]
    int64_t error_claim;        // int32 in device memory: the first failing block claims it atomically
    int64_t call_seq;           // int64 [EP_RT_CALL_KINDS] sequence numbers, then int32 [EP_RT_CALL_KINDS] tickets
    int64_t data;               // start of the data region
    int64_t data_bytes;         // size of the data region
};

// Kinds of collective call, each with its own sequence number in the control region (see sync.cuh).
#define EP_RT_CALL_BARRIER 0
#define EP_RT_CALL_NOTIFY 1
#define EP_RT_CALL_DISPATCH 2
#define EP_RT_CALL_COMBINE 3
#define EP_RT_CALL_KINDS 4

struct BarrierParams {
    uint64_t peer_buffers[EP_RT_MAX_NVL_RANKS];
    uint64_t error;             // ErrorRecord* (host-mapped)
    struct ControlLayout ctrl;
    int64_t timeout_ns;
    int32_t rank;
    int32_t num_ranks;
};

struct NotifyParams {
    uint64_t peer_buffers[EP_RT_MAX_NVL_RANKS];
    uint64_t error;
    uint64_t num_tokens_per_rank;        // int32 [R]
    uint64_t num_tokens_per_expert;      // int32 [E] or 0
    uint64_t is_token_in_rank;           // bool [N, R]
    uint64_t send_pos;                   // out int32 [N, R]: position among tokens sent to that rank, -1 if not sent
    uint64_t channel_prefix_matrix;      // out int32 [R, C]: inclusive prefix over my channels, per destination
    uint64_t rank_prefix_matrix;         // out int32 [R, R]: inclusive prefix over sources, every column
    uint64_t recv_channel_prefix_matrix; // out int32 [R, C]: exclusive start of source's channel in its block
    uint64_t host_counters;              // host-mapped int32 HostCounters
    struct ControlLayout ctrl;
    int64_t host_token;                  // > 0: publish the counts to the host under this token; 0: do not
    int64_t timeout_ns;
    int64_t dispatch_row_bytes;          // bytes one dispatched token needs in the data region
    int64_t combine_row_bytes;           // bytes one combined token needs in the data region
    int32_t rank;
    int32_t num_ranks;
    int32_t num_tokens;
    int32_t num_channels;
    int32_t num_experts;                 // 0 when no per-expert counts are given
    int32_t expert_alignment;
    int32_t hidden_bytes;                // checked equal on all ranks
    int32_t num_topk;                    // checked equal on all ranks
};

// One notify slot per source rank in each receiver's control region (int32 words; flag is int64 at word 0).
#define EP_RT_NOTIFY_SLOT_BYTES 5120
#define EP_RT_NOTIFY_HIDDEN_BYTES 2
#define EP_RT_NOTIFY_NUM_TOPK 3
#define EP_RT_NOTIFY_NUM_CHANNELS 4
#define EP_RT_NOTIFY_NUM_EXPERTS 5
#define EP_RT_NOTIFY_NUM_TOKENS 6
#define EP_RT_NOTIFY_RANK_COUNTS 8
#define EP_RT_NOTIFY_CHANNEL_COUNTS 16
#define EP_RT_NOTIFY_EXPERT_COUNTS 144

// Host-mapped counters the notify kernel fills (int32 words) when the host waits for them (no num_worst_tokens;
// such a call is never in a CUDA graph). The call's host token (low 31 bits) is written last: the host waits for
// it, so a late notify of an earlier call can never be mistaken for this one.
#define EP_RT_HOST_NUM_RECV 0
#define EP_RT_HOST_MAX_DISPATCH_ROWS 1
#define EP_RT_HOST_MAX_COMBINE_ROWS 2
#define EP_RT_HOST_TOKEN 3
#define EP_RT_HOST_MAX_TOKENS 4
#define EP_RT_HOST_EXPERT_COUNTS 5
#define EP_RT_HOST_COUNTER_WORDS (5 + EP_RT_MAX_LOCAL_EXPERTS)

// A call larger than the data region runs in rounds (issue 22): round k carries every source's tokens
// [k * T, (k + 1) * T), so at most R * T rows reach a rank (T = capacity / R); each round has its own notify and
// prefix matrices (round_rpm[k]). Rows are written to their row in the whole call's output: a source's block
// there starts at full_rpm's start plus what that source sent in earlier rounds.

// Data region of a dispatch (structure of arrays, row = final receive index).
struct DispatchRegion {
    int64_t x;          // [capacity, hidden_bytes]
    int64_t scales;     // int32 [capacity, num_scales]
    int64_t topk_idx;   // [capacity, num_topk] of recv_topk_idx's type (room for int64)
    int64_t topk_weights; // f32 [capacity, num_topk]
    int64_t src_idx;    // int32 [capacity]
    int64_t capacity;   // rows
};

struct DispatchParams {
    uint64_t peer_buffers[EP_RT_MAX_NVL_RANKS];
    uint64_t error;
    uint64_t x;                      // [N, hidden_bytes]
    uint64_t x_scales;               // 32-bit words, strided, or 0
    uint64_t topk_idx;               // int64 or int32 (topk_idx_bits) [N, K] or 0
    uint64_t topk_weights;           // f32 [N, K] or 0
    uint64_t send_pos;               // int32 [N, R]
    uint64_t rank_prefix_matrix;     // int32 [R, R]
    uint64_t recv_channel_prefix_matrix; // int32 [R, C]
    uint64_t recv_x;                 // [rows, hidden_bytes]
    uint64_t recv_x_scales;          // int32 [rows, num_scales] or 0
    uint64_t recv_topk_idx;          // int64 or int32 (recv_topk_idx_bits) [rows, K] or 0
    uint64_t recv_topk_weights;      // f32 [rows, K] or 0
    uint64_t recv_src_idx;           // int32 [rows]
    uint64_t round_rpm;              // a call in rounds (see below): int32 [rounds, R, R], else 0
    uint64_t full_rpm;               // a call in rounds: the whole call's rank_prefix_matrix int32 [R, R]
    struct ControlLayout ctrl;
    struct DispatchRegion region;
    int64_t scale_token_stride;      // in 32-bit words
    int64_t scale_hidden_stride;
    int64_t timeout_ns;
    int32_t rank;
    int32_t num_ranks;
    int32_t num_tokens;
    int32_t num_channels;
    int32_t hidden_bytes;            // multiple of 16
    int32_t num_scales;
    int32_t num_topk;
    int32_t num_local_experts;
    int32_t num_out_rows;            // rows allocated in recv_* (num_worst_tokens or the exact count)
    int32_t fill_unused_rows;        // num_worst_tokens mode: recv_topk_idx = -1 past the real count
    int32_t handshake;               // cached mode: no notify ran, wait for peers before writing
    int32_t topk_idx_bits;           // 64 or 32: the width of topk_idx
    int32_t recv_topk_idx_bits;      // 64 or 32: the width of recv_topk_idx (ep_rt.topk_idx_t), also in the region
    int32_t round;                   // a call in rounds: this round's index
    int32_t token_offset;            // a call in rounds: the call's index of this round's first token (recv_src_idx)
    int32_t pad;
};

struct CombineRegion {
    int64_t x;            // bf16 [capacity, hidden]
    int64_t topk_weights; // f32 [capacity, num_topk]
    int64_t capacity;
};

struct CombineParams {
    uint64_t peer_buffers[EP_RT_MAX_NVL_RANKS];
    uint64_t error;
    uint64_t x;                      // bf16 [num_in_rows, hidden], dispatch order
    uint64_t topk_weights;           // f32 [num_in_rows, K] or 0
    uint64_t bias0;                  // bf16 [N, hidden] or 0
    uint64_t bias1;                  // bf16 [N, hidden] or 0
    uint64_t send_pos;               // int32 [N, R]
    uint64_t rank_prefix_matrix;     // int32 [R, R]
    uint64_t recv_channel_prefix_matrix; // int32 [R, C]
    uint64_t combined_x;             // bf16 [N, hidden]
    uint64_t combined_topk_weights;  // f32 [N, K] or 0
    uint64_t round_rpm;              // a call in rounds: int32 [rounds, R, R] of its dispatch, else 0
    uint64_t full_rpm;               // a call in rounds: the whole dispatch's rank_prefix_matrix
    struct ControlLayout ctrl;
    struct CombineRegion region;
    int64_t timeout_ns;
    int32_t rank;
    int32_t num_ranks;
    int32_t num_tokens;
    int32_t num_channels;
    int32_t hidden;                  // elements, multiple of 8
    int32_t num_topk;
    int32_t num_in_rows;
    int32_t round;                   // a call in rounds: this round's index
};

// ---- low-latency mode -------------------------------------------------------------------------
// The symmetric buffer: the caller's num_rdma_bytes hold the data of two alternating buffers, one fixed half
// each (staging area, then receive area, sized per call), followed by ep_rt's control area at fixed offsets
// (every word a u64 NVSHMEM signal word):
//   credits           [2][R]                    the tag each peer last consumed, per buffer
//   count signals     [2][EP_RT_LL_MAX_SIGNALS]  dispatch: word l * R + s from source s
//   combine flags     [2][EP_RT_LL_MAX_SIGNALS]  combine: word l * R + s from rank s (whose expert it is)
//   dispatch arrivals [2][EP_RT_LL_MAX_SIGNALS]  word l * R + s: messages of that cell arrived from a rank s of
//   combine arrivals  [2][EP_RT_LL_MAX_SIGNALS]  another node (SIGNAL_ADD 1 each), cleared by the receiver
//   barrier words     [R]                        ep_rt_ll_barrier: word s from rank s (never cleaned)
// A signal is (tag << 32) | (shape digest << 16) | count: the digest of the sender's call shape (host-computed from
// T, hidden, experts and the message format) catches a rank that calls with another; the count is the cell's
// messages (dispatch) or rows (combine). Over NVLink a signal is a release store after the data; for a rank of
// another node it is a signal op (SIGNAL_SET) that orders nothing, and the receiver then waits until the cell's
// arrival word holds the count: each message is a put-with-signal adding 1 there after its own data.
// Every signal word has one writer (rank word % R) whatever the call's shape, so a late signal can only be
// overtaken by its own writer's later ones. tag = epoch % (2^32 - 1) + 1 as a 32-bit pattern (never 0, the
// cleaned value), from the per-buffer epoch in device memory, so that CUDA-graph replays advance it too.
// Buffer credits: when a rank's receive kernel has finished reading buffer b, it clears b's arrival words and
// writes its call's tag into every peer's credit word [b][rank]; a send kernel writes into a peer's buffer b (and
// rewrites its own staging area of b) only once that peer's credit holds the tag of the previous call on b (or of
// this call: a combine receive that needs nothing from us ends without waiting for us). So no rank ever
// overwrites what a peer has not consumed, in any shape, and no quiet is ever needed.
#define EP_RT_LL_MAX_SIGNALS 65536  // = the most experts an LL call takes
#define EP_RT_LL_MAX_TOKENS 1024
#define EP_RT_LL_MAX_TOPK 16
#define EP_RT_LL_MAX_HIDDEN 16384  // the dispatch send kernel builds a message in shared memory
// Workspace (device memory, int32 words): per-expert send counters, then these words.
#define EP_RT_LL_WS_TICKETS 0        // [4]: last-block tickets (dispatch send, dispatch recv, combine send, recv)
#define EP_RT_LL_WS_EPOCH 4          // [2]: per-buffer use counters
#define EP_RT_LL_WS_CLAIM 6          // error claim word
#define EP_RT_LL_WS_ARRIVED 8        // uint64 (words 8-9): dispatch receive blocks at the current barrier
#define EP_RT_LL_WS_ARRIVED_GEN 10   // uint64 (words 10-11): dispatch receive barriers completed
#define EP_RT_LL_WS_COUNTERS 16      // [num_experts]: per-expert send slots

struct LowLatencyParams {
    uint64_t x;                    // dispatch: bf16 [N, H]; combine: bf16 [L, R*T, H] (packed expert outputs)
    uint64_t topk_idx;             // int64 or int32 (topk_idx_bits) [N, K]
    uint64_t topk_weights;         // combine: f32 [N, K]
    uint64_t peer_bases;           // device uint64 [R]: NVLink-mapped symmetric base of each rank, 0 = remote
    uint64_t sym_base;             // this rank's symmetric base (offsets are identical on every rank)
    uint64_t workspace;            // device int32 words, see EP_RT_LL_WS_*
    uint64_t mask;                 // int32 [R] (shrink mode) or 0
    uint64_t error;                // ErrorRecord* (host-mapped)
    uint64_t recv_x;               // dispatch out: [L, R*T, H] fp8 or bf16; combine out: bf16 [N, H]
    uint64_t recv_x_scales;        // dispatch out: f32 [L, S, R*T] or int32 [L, S/4, R*T] (column-major view)
    uint64_t recv_src_info;        // dispatch out / combine in: int32 [L, R*T]
    uint64_t recv_layout_range;    // dispatch out / combine in: int64 [L, R]
    uint64_t recv_count;           // dispatch out: int32 [L]
    uint64_t cumulative_stats;     // int32 [L] or 0
    uint64_t wait_stats;           // int64 [R] or 0 (clock cycles spent waiting per source)
    int64_t signal_off;            // this call's buffer: dispatch count signals or combine flags (control area)
    int64_t send_off;              //                     send (staging) area
    int64_t recv_off;              //                     receive area
    int64_t credit_off;            // u64 [2 buffers][R]: the tag each peer last consumed (control area)
    int64_t arrival_off;           // this call's buffer: dispatch or combine arrival words (control area)
    int64_t barrier_seq;           // ep_rt_ll_barrier: this barrier's number (signal_off = the barrier words)
    int64_t msg_bytes;             // dispatch: 16 + max(2H, H + 4S); combine: 2H + 4S
    int64_t timeout_ns;
    int32_t rank;
    int32_t num_ranks;
    int32_t num_tokens;
    int32_t max_tokens;            // T
    int32_t hidden;
    int32_t num_topk;
    int32_t num_experts;
    int32_t buffer_idx;
    int32_t use_fp8;
    int32_t round_scale;
    int32_t use_ue8m0;
    int32_t zero_copy;
    int32_t has_remote_peers;      // some rank is reached through NVSHMEM puts (not NVLink stores)
    int32_t use_logfmt;            // combine: rows travel LogFMT-10 encoded (kernels_src/include/ep_rt/logfmt.cuh)
    int32_t shape_digest;          // 16 bits: digest of this call's shape, carried in its signals
    int32_t topk_idx_bits;         // 64 or 32: the width of topk_idx
};

// ---- internode high-throughput mode (kernels_src/internode.cu) ----------------------------------
// Ranks R = N nodes x G ranks; rank = node * G + local. Rank me = (node m, local j); its "rail peer" on node n is
// n * G + j, and the kernels talk over the network ONLY to rail peers (PE pe_base + n * pe_stride: a world of
// rail peers, or one of all ranks). Everything inside a node goes through the NVL buffers (IPC mappings), never
// through NVSHMEM. Only the GPU a NIC wrote into reads those bytes (docs/INTERNODE_DESIGN.md, "Network rules").
// Dispatch: notify (each rank puts one slot per other node to its rail peer there; each rail peer relays the
// parts for its node's ranks into their NVL buffers), send (each token once per destination node, put to the
// rail peer's receive area [my node][stream position]), forward (the rail peer reads its own receive area and
// pushes each record over NVLink into the NVL buffer of every local rank it is for, at its final row), receive
// (every rank copies its rows from its own NVL buffer into its outputs). Combine: publish (each rank copies its
// rows into its NVL buffer), forward (the rail peer sums a token's local rows in f32 -> bf16 and puts it back to
// the source), reduce (the source sums bias and nodes in f32). Symmetric buffer: staging [N][cap] and receive
// [N][cap] records in the caller's num_rdma_bytes, then a control area at fixed offsets.
#define EP_RT_IN_MAX_RANKS 256
#define EP_RT_IN_MAX_NODES 64
// Each (channel, destination node) stream of records (dispatch) or partial sums (combine) goes over the network in
// min(count, EP_RT_IN_STREAM_CHUNKS) put-with-signals (an empty stream: one bare signal), so the receiving side works
// on the first chunks while the last are on the wire. Chunk k of n covers [count * k / n, count * (k + 1) / n) and
// has a signal word of its own: signals of different chunks may arrive in any order (several queue pairs, adaptive
// routing), so a count of signals on one word would not say which chunks are in.
#define EP_RT_IN_STREAM_CHUNKS 8
// Notify slot (int32 words) a source puts to its rail peer on node n, and the per-rank part the rail peer relays
// to each rank d of node n (in d's NVL buffer, one slot per source rank). Both start with this header, then:
//   rank totals [R], node totals [N], stream counts to node n per channel [C], then
//   network slot: for each local rank l of node n: channel counts to (n, l) [C], expert counts for (n, l) [L]
//   relayed slot: channel counts to d [C], expert counts for d [L]
#define EP_RT_IN_SLOT_HIDDEN_BYTES 0
#define EP_RT_IN_SLOT_NUM_TOPK 1
#define EP_RT_IN_SLOT_NUM_CHANNELS 2
#define EP_RT_IN_SLOT_NUM_EXPERTS 3
#define EP_RT_IN_SLOT_NUM_SCALES 4
#define EP_RT_IN_SLOT_HEADER 8
// Workspace words (int64, device memory): call numbers per kind, then tickets, the error claim, the skip flag.
#define EP_RT_IN_WS_NOTIFY 0
#define EP_RT_IN_WS_DISPATCH 1
#define EP_RT_IN_WS_CACHED 2
#define EP_RT_IN_WS_COMBINE 3
#define EP_RT_IN_WS_BARRIER 4
#define EP_RT_IN_WS_TICKET 8           // int64 words 8..15: last-block tickets per kernel
#define EP_RT_IN_WS_CLAIM 16           // error claim (int32 at this int64 word)
#define EP_RT_IN_WS_SKIP 17            // 1: this dispatch does not fit (all ranks agree); move no data
#define EP_RT_IN_WS_DEFERRED 18        // int64 words 18..20: a caller's error found mid-call (internode.cu)
#define EP_RT_IN_WS_WORDS 32
// Handshake kinds: their words in the symmetric control area ([kind][source node]) and in the NVL control area
// ([kind][source local rank]).
#define EP_RT_IN_HS_CACHED 0
#define EP_RT_IN_HS_COMBINE 1
#define EP_RT_IN_HS_BARRIER 2
#define EP_RT_IN_HS_KINDS 3
// Host counters (int32, host-mapped), token written last.
#define EP_RT_IN_HOST_TOKEN 0
#define EP_RT_IN_HOST_NUM_RECV 1
#define EP_RT_IN_HOST_NUM_RDMA_RECV 2
#define EP_RT_IN_HOST_MAX_STREAM 3
#define EP_RT_IN_HOST_MAX_RECV 4
#define EP_RT_IN_HOST_MAX_FWD 5
#define EP_RT_IN_HOST_EXPERT_COUNTS 8
#define EP_RT_IN_HOST_WORDS (8 + EP_RT_MAX_LOCAL_EXPERTS)
// Phases (errors.py)
#define EP_RT_PHASE_IN_NOTIFY 12
#define EP_RT_PHASE_IN_HANDSHAKE 13
#define EP_RT_PHASE_IN_FORWARD 14
#define EP_RT_PHASE_IN_RECV 15
#define EP_RT_PHASE_IN_COMBINE_HANDSHAKE 16
#define EP_RT_PHASE_IN_COMBINE_FORWARD 17
#define EP_RT_PHASE_IN_COMBINE_REDUCE 18
#define EP_RT_PHASE_IN_NOTIFY_RELAY 19

// Byte offsets in the symmetric buffer, identical on every rank (ep_rt/transport/internode_layout.py). Every
// word here is written by the network (a rail peer's put-with-signal or signal op) or by this rank itself, and
// read only by this rank.
struct InternodeLayout {
    int64_t stage;           // [N][cap] records (dispatch) or combine records
    int64_t recv;            // [N][cap] records
    int64_t cap;             // records per node area
    int64_t record_bytes;    // of this call (dispatch or combine record)
    int64_t slot_bytes;      // one network notify slot
    int64_t notify_send;     // [N] slots: mine for the rail peer on node n
    int64_t notify_recv;     // [N] slots: from the rail peer on node s (s = my node: my own, written locally)
    int64_t notify_words;    // u64 [N]: word s from the rail peer on node s, +1 per notify
    int64_t dispatch_words;  // u64 [N][EP_RT_MAX_CHANNELS][EP_RT_IN_STREAM_CHUNKS]: word [s][c][k] from the rail peer
        // on node s, +1 per dispatch whose stream (s, c) has a chunk k
    int64_t combine_words;  // u64 [N][EP_RT_MAX_CHANNELS][EP_RT_IN_STREAM_CHUNKS]: word [n][c][k] from my rail peer
        // on node n, +1 per combine whose stream (n, c) has a chunk k
    int64_t hs_words;  // u64 [EP_RT_IN_HS_KINDS][N]: handshakes, word [kind][s] from the rail peer on node s
    int64_t own_ready;  // int64 [2][EP_RT_MAX_CHANNELS]: my own node's records (dispatch) or partial sums
        // (combine) of channel c are written (call number); written and read by me only
    int64_t end;
};

// Byte offsets in each rank's NVL buffer (IPC-mapped on its node), identical on every rank of the node. Each
// word has one writer: a node peer (through its NVLink mapping) or the rank itself.
struct InternodeNvlLayout {
    int64_t slot_bytes;  // one relayed notify slot
    int64_t slots;  // [R] relayed notify slots, slot src written by src's rail peer on my node
    int64_t slot_flags;  // int64 [R]: notify call number, after slot src
    int64_t hs;  // int64 [EP_RT_IN_HS_KINDS][G]: handshake call numbers from local rank l
    int64_t pub;  // int32 [R][EP_RT_MAX_CHANNELS]: my recv_gbl_channel_prefix_matrix (dispatch)
    int64_t pub_flag;  // int64: dispatch call number, after pub
    int64_t relay;  // int64 [R][EP_RT_MAX_CHANNELS]: dispatch call number: block (src, c) is pushed here
    int64_t ready;  // int64: combine call number: my combine rows are in records
    int64_t ready_prefix;  // int32 [R]: my recv_gbl_rank_prefix_sum (combine)
    int64_t records;  // dispatch records at their final rows, or combine rows
    int64_t records_bytes;
};

struct InternodeParams {
    uint64_t sym_base;  // this rank's symmetric buffer (no mapping of any other rank's is ever passed)
    uint64_t nvl_peers[EP_RT_MAX_NVL_RANKS];  // base of each local rank's internode NVL area (InternodeNvlLayout)
    uint64_t workspace;  // device int64 [EP_RT_IN_WS_WORDS]
    uint64_t error;  // ErrorRecord* (host-mapped)
    uint64_t host_counters;  // host-mapped int32 [EP_RT_IN_HOST_WORDS]
    uint64_t scratch;  // device int32 [C][R + N]: per-channel counts (notify)
    uint64_t consumed;  // device int64 [2][EP_RT_IN_MAX_NODES][EP_RT_MAX_CHANNELS][EP_RT_IN_STREAM_CHUNKS]:
        // per (sender, channel, chunk) word, the signals this rank has consumed (dispatch
        // words, then combine words): a call may use fewer channels or chunks than the
        // last, so a word's count is not the call number
    uint64_t x;  // dispatch: [T, hidden_bytes]; combine: bf16 [num_in_rows, hidden]
    uint64_t x_scales;  // 32-bit words, strided, or 0
    uint64_t topk_idx;  // int64 or int32 [T, K] or 0
    uint64_t topk_weights;  // f32: dispatch [T, K]; combine [num_in_rows, K]; or 0
    uint64_t is_token_in_rank;  // bool [T, R]
    uint64_t num_tokens_per_expert;  // int32 [E] or 0
    uint64_t bias0, bias1;  // bf16 [T, hidden] or 0
    uint64_t rdma_cpm;  // handle [1] int32 [N, C]
    uint64_t gbl_cpm;  // handle [2] int32 [R, C]
    uint64_t recv_rdma_cpm;  // handle [3] int32 [N, C]
    uint64_t recv_rdma_prefix;  // handle [4] int32 [N]
    uint64_t recv_gbl_cpm;  // handle [5] int32 [R, C]
    uint64_t recv_gbl_prefix;  // handle [6] int32 [R]
    uint64_t recv_src_meta;  // handle [7] uint8 [rows, 8] or 0 (cached)
    uint64_t send_rdma_head;  // handle [8] int32 [T, N]
    uint64_t send_nvl_head;  // handle [9] int32 [fwd_rows, G] or 0 (cached)
    uint64_t recv_x;  // [rows, hidden_bytes]
    uint64_t recv_x_scales;  // int32 [rows, S] or 0
    uint64_t recv_topk_idx;  // [rows, K] of recv_topk_idx_bits, or 0
    uint64_t recv_topk_weights;  // f32 [rows, K] or 0
    uint64_t combined_x;  // bf16 [T, hidden]
    uint64_t combined_topk_weights;  // f32 [T, K] or 0
    struct InternodeLayout lay;
    struct InternodeNvlLayout nvl;
    int64_t scale_token_stride;  // in 32-bit words
    int64_t scale_hidden_stride;
    int64_t host_token;  // > 0: publish counts to the host under this token
    int64_t net_timeout_ns;  // every wait (each depends on the network: EP_RT_NET_TIMEOUT_S)
    int64_t nvl_capacity_rows;  // rows of this call's record size the NVL records region holds
    int32_t rank;
    int32_t num_ranks;
    int32_t ranks_per_node;  // G
    int32_t num_nodes;  // N
    int32_t pe_base;  // NVSHMEM PE of my rail peer on node n: pe_base + n * pe_stride
    int32_t pe_stride;
    int32_t num_tokens;
    int32_t num_channels;
    int32_t hidden_bytes;  // dispatch: row bytes (multiple of 16); combine: 2 * hidden
    int32_t num_scales;
    int32_t num_topk;
    int32_t num_experts;
    int32_t expert_alignment;
    int32_t num_out_rows;  // rows of recv_* (num_worst_tokens or num_recv)
    int32_t num_fwd_rows;  // rows of send_nvl_head (num_worst_tokens or num_rdma_recv)
    int32_t num_in_rows;  // combine: rows of x
    int32_t cached;  // dispatch from a handle: handshake, no notify, no topk
    int32_t fill_unused;  // num_worst_tokens: recv_topk_idx and send_nvl_head = -1 past the real rows
    int32_t topk_idx_bits;
    int32_t recv_topk_idx_bits;
};
