"""The network rules of issue 21, held on the kernel sources and the parameter layouts (no NIC can run here, so
each rule is a check that fails when a kernel breaks it; include/ep_rt/net.cuh and docs/INTERNODE_DESIGN.md,
"Network rules", say why each holds on a real network):

  1. only the GPU a NIC wrote into reads those bytes: no kernel gets a mapping of another rank's symmetric buffer
     for internode traffic, and the LL kernels use their NVLink mappings of peers only as store destinations;
  2. no quiet and no fence in any data path (on IBGDA each sweeps every queue pair), in both cubin flavours;
  3. flags a remote PE writes are signal operations; every NVSHMEM call goes through net.cuh; the internode kernels
     reach only their rail peers over the network (node peers and themselves through the NVL buffers)."""

import re
from pathlib import Path

from ep_rt.runtime import abi

from ..repo import REPO

SRC = REPO / "kernels_src"


def _code(path: Path) -> str:
    """The source without comments."""
    text = path.read_text()
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def _without_branches(text: str, macro_test: str) -> str:
    """`text` with every `#if <macro_test>` ... `#else` part removed (keeping the #else part), nesting-aware."""
    out, depth, skipping = [], 0, []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#if"):
            depth += 1
            skipping.append(macro_test in s)
            if skipping[-1]:
                continue
        elif s.startswith("#else") and skipping and skipping[-1]:
            skipping[-1] = False
            continue
        elif s.startswith("#endif") and skipping:
            was = skipping.pop()
            depth -= 1
            if was:
                continue
        if any(skipping):
            continue
        out.append(line)
    return "\n".join(out)


def test_every_nvshmem_call_is_in_net_cuh():
    for family in ("low_latency.cu", "internode.cu"):
        code = _code(SRC / family)
        assert not re.findall(r"\bnvshmemx?_\w+", code), family
        assert "#include <nvshmem" not in code, family


def test_no_quiet_or_fence_on_the_real_transport():
    """The cu13 build of net.cuh (not NVRTC, not the chaos test build) issues no quiet and no fence; the kernels
    call none either."""
    net = _code(SRC / "include" / "ep_rt" / "net.cuh")
    real = _without_branches(net, "defined(__CUDACC_RTC__)")
    real = real[: real.index("#else  ")] if "#else  " in real else real  # up to the chaos build
    assert "nvshmemx_putmem_signal_nbi_block" in real and "nvshmemx_putmem_signal_nbi_warp" in real
    assert "__CUDACC_RTC__" not in net  # both flavours make the same calls (no put + quiet + signal under NVRTC)
    # nvshmem_quiet only inside net_quiet, which no data path calls; no fence at all
    assert re.findall(r"nvshmem_quiet\(\)", real) == ["nvshmem_quiet()"]
    assert "void net_quiet() { nvshmem_quiet(); }" in real and not re.findall(r"nvshmem_fence\b", real)
    for family in ("low_latency.cu", "internode.cu"):
        code = _code(SRC / family)
        if family == "low_latency.cu":  # the probe kernel's one quiet, there to show the cost mode charging it
            code = code[: code.index("ep_rt_ll_net_probe")]
        assert not re.findall(r"\bnet_(quiet|fence)\s*\(", code), family
        assert not re.findall(r"__threadfence_system\(\);\s*net_", code), family


def test_remote_flags_are_signal_operations():
    """No nvshmem_p of a flag, no plain put without a signal: the wrappers are put-with-signal and signal ops."""
    net = _code(SRC / "include" / "ep_rt" / "net.cuh")
    assert not re.findall(r"nvshmem\w*_p\s*\(", net)
    wrappers = set(re.findall(r"__device__ __forceinline__ void (net_\w+)\(", net))
    assert wrappers == {
        "net_put_signal_block",
        "net_put_signal_warp",
        "net_signal_add",
        "net_signal_set",
        "net_flush",
        "net_quiet",
        "net_count",
    }, wrappers


def test_internode_kernels_get_no_mapping_of_another_ranks_symmetric_buffer():
    fields = [name for name, _ in abi.InternodeParams._fields_]
    assert "sym_peers" not in fields
    header = _code(SRC / "include" / "ep_rt" / "params.h")
    struct = re.search(r"struct InternodeParams \{(.*?)\};", header, re.S).group(1)
    assert "sym_peers" not in struct and "peer_bases" not in struct


def test_internode_symmetric_and_nvl_offsets_never_mix():
    """Symmetric memory (in.local / in.word / in.record) is addressed only with p.lay offsets, NVL areas (in.nvl /
    in.nvl_word) only with p.nvl offsets: a symmetric receive area is never read through an NVL mapping."""
    code = _code(SRC / "internode.cu")
    for call in re.finditer(r"\bin\.(local|word|record|nvl|nvl_word)\(([^;]*?)\)", code):
        kind, args = call.groups()
        offsets = set(re.findall(r"p\.(lay|nvl)\.", args))
        if kind in ("nvl", "nvl_word"):
            assert offsets <= {"nvl"}, call.group(0)
        else:
            assert offsets <= {"lay"}, call.group(0)


def test_internode_network_calls_go_to_rail_peers_only():
    """Every network call of internode.cu names its PE as in.pe(node): my rail peer on that node."""
    code = _code(SRC / "internode.cu")
    calls = re.findall(r"\bnet_(put_signal_block|put_signal_warp|signal_add|signal_set)\s*\(((?:[^;])*?)\);", code)
    assert len(calls) >= 5
    for name, args in calls:
        assert re.search(r"in\.pe\(\w+\)\s*$", args.strip()), (name, args)


def test_ll_kernels_use_peer_mappings_only_to_store():
    """Every use of an NVLink mapping of a peer in low_latency.cu (ll.peer) is one of these: a store destination or
    the remote test. A new line that reads through a peer mapping fails here."""
    code = _code(SRC / "low_latency.cu")
    uses = [line.strip() for line in code.splitlines() if re.search(r"\bpeer\(|\bpeer_bases\b", line)]
    allowed = [
        "__device__ uint64_t peer(int r) const { return reinterpret_cast<const uint64_t*>(p.peer_bases)[r]; }",
        "__device__ bool remote(int r) const { return peer(r) == 0; }",
        "const uint64_t base = ll.peer(r);",  # signal_rank: a release store
        "const uint64_t base = ll.peer(dst);",  # dispatch send: st_na_v4 stores
        "const uint64_t base = ll.peer(s);",  # combine send: rows written into nvl_dst
    ]
    assert sorted(uses) == sorted(allowed), uses
    for var_use in re.findall(r"[^\n]*\bbase\b[^\n]*", code):
        if "= ll.peer(" in var_use or "uint64_t base" in var_use:
            continue
        assert re.search(
            r"st_release_sys\(reinterpret_cast<int64_t\*>\(base \+ off\)|"
            r"int4\* out = reinterpret_cast<int4\*>\(base \+ off\)|nvl_dst\[q\] = base \+ slot|"
            r"if \((fits && )?base != 0\)",  # (the packed variants skip a message past its block)
            var_use,
        ), var_use


def test_ll_remote_messages_are_counted_by_their_own_signal():
    """Data for a rank of another node is a put-with-signal that adds to the cell's arrival word; the receiver waits
    for the count, then for that many arrivals, and clears the words before its credit."""
    code = _code(SRC / "low_latency.cu")
    assert len(re.findall(r"net_put_signal_warp\([^;]*ll\.arrival\(", code)) == 2
    assert code.count("wait_arrivals(") >= 3  # its definition and the two receivers
    release = code[code.index("__device__ void release_buffer") : code.index("__device__ bool wait_arrivals")]
    assert release.index("ll.arrival(c)) = 0") < release.index("__threadfence_system()") < release.index("signal_rank(")


def test_every_chunk_has_its_own_signal_word():
    """Signals of different chunks of one stream may arrive in any order (several queue pairs, adaptive routing; the
    chaos transport reorders them): a reader that counted k signals on one shared word and then read chunk k-1 could
    read a chunk still on the wire (the chaos suite caught exactly that). Every chunked put and every wait names
    the chunk's own word."""
    code = _code(SRC / "internode.cu")
    for kind in ("dispatch_words", "combine_words"):
        uses = re.findall(r"p\.lay\." + kind + r",\s*([^)]*\))", code)
        assert uses and all(u.startswith("chunk_word(") for u in uses), (kind, uses)
    waits = re.findall(r"wait_next\(in\.word\(p\.lay\.(\w+), ([^)]*\))\)", code)
    assert len(waits) == 2 and all(arg.startswith("chunk_word(") for _, arg in waits), waits


def _wait_calls(code: str, name: str) -> list[str]:
    """The argument text of every call of `name` (balanced parentheses)."""
    calls = []
    for m in re.finditer(r"\b" + name + r"\(", code):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        calls.append(code[m.end() : i - 1])
    return calls


def test_internode_waits_for_my_node_outlast_waits_for_the_network():
    """A wait for a word of my node (wait_flag: NVL words, my own earlier kernel's flags) is set by a writer that
    first waits on the network itself. With equal deadlines a node's death could be reported by a live rank of my
    node that waited for the same node (the killed-node GPU test saw a survivor name itself): so every wait_flag
    has the node deadline (twice the network's) and every wait on a network word (wait_word, wait_next) has the
    network's. The host's wait for the notify outlasts both."""
    code = _code(SRC / "internode.cu")
    body = code[code.index("__device__ int64_t node_timeout_ns") :]
    assert "return 2 * p.net_timeout_ns;" in body.split("}")[0], "node deadline is not twice the network's"
    flags = _wait_calls(code[code.index("struct In {") :], "wait_flag")
    words = [c for c in _wait_calls(code, "wait_word") + _wait_calls(code, "wait_next") if "in.word(" in c]
    assert len(flags) == 7 and all("in.node_timeout_ns()" in c and "net_timeout_ns" not in c for c in flags), flags
    assert len(words) == 4 and all("net_timeout_ns" in c and "node_timeout" not in c for c in words), words
    host = "".join((REPO / "ep_rt" / "ops" / "internode.py").read_text().split())  # (however it is wrapped)
    assert "wait_for_token(self.counters,abi.EP_RT_IN_HOST_TOKEN,token,2*self.net_timeout_s" in host
