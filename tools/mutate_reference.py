#!/usr/bin/env python3
"""Mutation testing of the plain-torch reference (ep_rt/reference/): does the CPU suite notice a wrong oracle?

Each entry of MUTATIONS is one small semantic change of a reference module (an operator, a rounding, an order, an
off-by-one). The tool copies the package and the reference tests into a scratch folder, applies one mutation at a
time to the copy, runs the reference tests there (tests/reference/test_reference*.py by default) and reports which
mutations the tests kill (some test fails) and which survive. A mutation marked `equivalent` is one that cannot
change any result the reference is used for; the reason says why, and the tool reports it if it is killed after all.

MUTATIONS is the single source of docs/REFERENCE_MUTATIONS.md: `--write-doc` regenerates the doc's table from it
and from the run (tests/tools/test_reference_mutations.py checks that the doc and this list agree, and that every
mutation still applies to the current sources).

    python tools/mutate_reference.py                 # every mutation, a table on stdout
    python tools/mutate_reference.py --only fp8-scale-reciprocal logfmt-offset-1.5
    python tools/mutate_reference.py --write-doc docs/REFERENCE_MUTATIONS.md

Stdlib only (plus the project's own test dependencies: torch and pytest, in the Python that runs it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = "ep_rt/reference"
DEFAULT_TESTS = (
    "tests/reference/test_reference.py",
    "tests/reference/test_reference_ll.py",
    "tests/reference/test_reference_internode.py",
)
COPIED = ("ep_rt", "_ep_rt_deep_ep.py", "pyproject.toml", "tests/__init__.py")  # plus the test files, their
# folders' __init__.py (the tests are a package: their relative imports need every level) and the helper modules
# beside them
TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # under ep_rt/reference/
    edits: tuple  # (old, new) pairs; each old must occur exactly once in the file
    what: str  # one line for the doc
    equivalent: str = ""  # why the change cannot alter any result the reference is used for ("" = semantic)


def M(name, file, edits, what, equivalent=""):
    if isinstance(edits[0], str):
        edits = (edits,)
    return Mutation(name, file, tuple(edits), what, equivalent)


MUTATIONS = (
    # ---- fp8.py ---------------------------------------------------------------------------------------------
    M(
        "fp8-scale-reciprocal",
        "fp8.py",
        ("scale = torch.full_like(amax, FP8_MAX) / amax", "scale = FP8_MAX * torch.reciprocal(amax)"),
        "scale = 448 * rn(1 / amax) instead of one division rn(448 / amax)",
    ),
    M(
        "fp8-scale-scalar-division",
        "fp8.py",
        ("scale = torch.full_like(amax, FP8_MAX) / amax", "scale = FP8_MAX / amax"),
        "scale = `448.0 / amax` (torch computes a Python scalar over a tensor as reciprocal, then multiply)",
    ),
    M(
        "fp8-scale-inv-division",
        "fp8.py",
        ("        scale_inv = amax * inv_max\n", "        scale_inv = amax / FP8_MAX\n"),
        "scale_inv = rn(amax / 448) instead of rn(amax * f32(1/448))",
    ),
    M("fp8-margin", "fp8.py", ("FP8_MARGIN = 1e-4", "FP8_MARGIN = 1e-5"), "amax clamped at 1e-5 instead of 1e-4"),
    M(
        "fp8-no-saturation",
        "fp8.py",
        ("(groups * scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)", "(groups * scale.unsqueeze(-1))"),
        "no clamp to +-448 before the e4m3 cast",
        equivalent="|x * scale| <= rn(amax * rn(448 / amax)) < 464 (the e4m3 overflow threshold; round_scale: "
        "amax * 2**-e <= 448), so the cast rounds every value to at most 448 with or without the clamp",
    ),
    M(
        "ue8m0-round-down",
        "fp8.py",
        ("- 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # ceil(log2)", "- 127  # floor(log2)"),
        "round_scale exponent floor(log2) instead of ceil(log2)",
    ),
    M(
        "ue8m0-round-always-up",
        "fp8.py",
        ("- 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # ceil(log2)", "- 126  # floor(log2) + 1"),
        "round_scale exponent floor(log2) + 1 (wrong at exact powers of two)",
    ),
    M(
        "ue8m0-from-division",
        "fp8.py",
        ("bits = _f32_bits(amax * inv_max)", "bits = _f32_bits(amax / FP8_MAX)"),
        "round_scale exponent from rn(amax / 448) instead of rn(amax * f32(1/448))",
        equivalent="rn(amax * f32(1/448)) and rn(amax / 448) lie on the same side of every power of two: f32(1/448) "
        "is 0.75 * 2**-24 relative above 1/448, less than half the f32 spacing next to 2**k, and the f32 "
        "neighbours of 448 * 2**k are >= 6.8e-8 relative away (checked over every bf16 amax >= 1e-4 and "
        "every f32 within 300 ulps of 336, 448 and 449)",
    ),
    M(
        "ue8m0-byte-order",
        "fp8.py",
        (
            "word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)",
            "word = b[..., 3] | (b[..., 2] << 8) | (b[..., 1] << 16) | (b[..., 0] << 24)",
        ),
        "UE8M0 bytes packed big-endian",
    ),
    # ---- logfmt.py ------------------------------------------------------------------------------------------
    M(
        "logfmt-offset-1.5",
        "logfmt.py",
        ("rho = 2 - torch.log2((1 + torch.exp2(step_)) / 2) / step_", "rho = torch.full_like(step_, 1.5)"),
        "LogFMT rounding offset rho = 1.5 instead of 2 - log2((1 + 2**step) / 2) / step",
    ),
    M(
        "logfmt-offset-mirrored",
        "logfmt.py",
        (
            "rho = 2 - torch.log2((1 + torch.exp2(step_)) / 2) / step_",
            "rho = 1 + torch.log2((1 + torch.exp2(step_)) / 2) / step_",
        ),
        "LogFMT offset 1 + t instead of 2 - t (t = log2((1 + 2**step) / 2) / step, about 0.5)",
    ),
    M(
        "logfmt-log-range-31",
        "logfmt.py",
        ("LOGFMT_MAX_LOG_RANGE = 32.0", "LOGFMT_MAX_LOG_RANGE = 31.0"),
        "log_amin clipped at log2(amax) - 31 instead of - 32",
    ),
    M(
        "logfmt-steps-511",
        "logfmt.py",
        ("LOGFMT_NUM_STEPS = 510 ", "LOGFMT_NUM_STEPS = 511 "),
        "step = range / 511 instead of / 510",
    ),
    M(
        "logfmt-decode-code",
        "logfmt.py",
        ("mag = torch.exp2((c - 1) * step", "mag = torch.exp2(c * step"),
        "decode 2**(code * step + log_amin) instead of (code - 1)",
    ),
    M(
        "logfmt-castable-equal",
        "logfmt.py",
        ("(log_amin_raw < log_amax)", "(log_amin_raw <= log_amax)"),
        "a division with amin == amax counted castable",
    ),
    M(
        "logfmt-max-code-510",
        "logfmt.py",
        (".clamp(max=LOGFMT_MAX_CODE)", ".clamp(max=LOGFMT_MAX_CODE - 1)"),
        "codes clamped at 510 instead of 511",
    ),
    M(
        "logfmt-code-round",
        "logfmt.py",
        ("code = torch.floor(torch.clamp(q, min=0))", "code = torch.round(torch.clamp(q, min=0))"),
        "code = round(q) instead of floor(q)",
    ),
    # ---- low_latency.py -------------------------------------------------------------------------------------
    M(
        "ll-combine-k-descending",
        "low_latency.py",
        (
            "        for k in range(K):\n            e = idx[:, k]",
            "        for k in reversed(range(K)):\n            e = idx[:, k]",
        ),
        "LL combine adds the top-k terms in descending k",
    ),
    M(
        "ll-combine-fma",
        "low_latency.py",
        (
            "acc[t] = acc[t] + prod  # separate f32 add (no FMA)",
            "acc[t] = (acc[t].double() + w[sel, k].unsqueeze(1).double() * y.double()).float()",
        ),
        "LL combine fuses multiply and add (the f32 product is not rounded)",
    ),
    M(
        "ll-combine-weight-after",
        "low_latency.py",
        (
            "prod = w[sel, k].unsqueeze(1) * y  # f32 multiply, rounded to f32",
            "prod = y.to(torch.bfloat16).float() * w[sel, k].unsqueeze(1).to(torch.bfloat16).float()",
        ),
        "LL combine multiplies by a bf16-rounded weight",
    ),
    M(
        "ll-position-off-by-one",
        "low_latency.py",
        (
            "pos = csum.gather(1, flat.clamp(min=0).unsqueeze(1)).squeeze(1) - 1",
            "pos = csum.gather(1, flat.clamp(min=0).unsqueeze(1)).squeeze(1)",
        ),
        "row inside a block counted inclusively (off by one)",
    ),
    M(
        "ll-dispatch-source-descending",
        "low_latency.py",
        (
            "            begin = 0\n            for s in range(R):",
            "            begin = 0\n            for s in reversed(range(R)):",
        ),
        "LL receive blocks laid out by source rank descending",
    ),
    M(
        "ll-masked-block-begin",
        "low_latency.py",
        ("layout_range[l, s] = _pack_range(begin, 0)", "layout_range[l, s] = _pack_range(0, 0)"),
        "a masked source's empty block begins at 0 instead of the running sum",
    ),
    M(
        "ll-combine-minus-one-unmasked",
        "low_latency.py",
        ("sel = (e >= 0) & (e // L == o)", "sel = e // L == o"),
        "LL combine does not exclude topk_idx == -1 explicitly",
        equivalent="-1 // L is -1 (floor division), which is no rank, so a -1 entry is never selected either way",
    ),
    M(
        "ll-combine-expert-zero-dropped",
        "low_latency.py",
        ("sel = (e >= 0) & (e // L == o)", "sel = (e > 0) & (e // L == o)"),
        "LL combine treats expert 0 like -1",
    ),
    # ---- intranode.py ---------------------------------------------------------------------------------------
    M(
        "intra-send-pos-off-by-one",
        "intranode.py",
        (
            "pos = torch.cumsum(routed, dim=0, dtype=torch.int32) - 1",
            "pos = torch.cumsum(routed, dim=0, dtype=torch.int32)",
        ),
        "send_pos counted inclusively (off by one)",
    ),
    M(
        "intra-rank-prefix-exclusive",
        "intranode.py",
        (
            "rank_prefix_matrix = torch.cumsum(sent, dim=0, dtype=torch.int32).to(dev)",
            "rank_prefix_matrix = (torch.cumsum(sent, dim=0, dtype=torch.int32) - sent).to(dev)",
        ),
        "rank_prefix_matrix exclusive instead of inclusive",
    ),
    M(
        "intra-recv-channel-prefix-inclusive",
        "intranode.py",
        ("recv_cpm[src, 1:] = cpms[src][me, :-1]", "recv_cpm[src, :] = cpms[src][me, :]"),
        "recv_channel_prefix_matrix inclusive instead of exclusive",
    ),
    M(
        "intra-combine-descending",
        "intranode.py",
        (
            "for r in range(R):  # one rank at a time, ascending: fixes the f32 summation order",
            "for r in reversed(range(R)):",
        ),
        "intranode combine sums the ranks' copies in descending rank order",
    ),
    M(
        "intra-combine-bias-last",
        "intranode.py",
        (
            (
                "        acc = torch.zeros(N, H, dtype=torch.float32, device=xs[me].device)\n",
                "        acc = torch.zeros(N, H, dtype=torch.float32, device=xs[me].device)\n        late = []\n",
            ),
            ("                acc += b.float()\n", "                late.append(b.float())\n"),
            (
                '        results.append({"combined_x": acc.to(torch.bfloat16)',
                "        for b in late:\n            acc += b\n"
                '        results.append({"combined_x": acc.to(torch.bfloat16)',
            ),
        ),
        "intranode combine adds the biases after the ranks' copies instead of first",
    ),
    M(
        "intra-alignment-round-down",
        "intranode.py",
        ("[(int(c) + a - 1) // a * a for c in counts]", "[int(c) // a * a for c in counts]"),
        "expert_alignment rounds the per-expert counts down instead of up",
    ),
    M(
        "intra-topk-idx-fill-zero",
        "intranode.py",
        ("idx = gather(topk_idxs, fill=-1)", "idx = gather(topk_idxs, fill=0)"),
        "num_worst_tokens padding rows of recv_topk_idx filled with 0 instead of -1",
    ),
    M(
        "intra-non-local-topk-zero",
        "intranode.py",
        (
            'res["recv_topk_idx"] = torch.where(local, idx - me * L, torch.full_like(idx, -1))',
            'res["recv_topk_idx"] = torch.where(local, idx - me * L, torch.zeros_like(idx))',
        ),
        "recv_topk_idx of experts on other ranks 0 instead of -1",
    ),
    # ---- layout.py ------------------------------------------------------------------------------------------
    M(
        "layout-channel-floor",
        "layout.py",
        ("per = (num_tokens + num_channels - 1) // num_channels", "per = max(num_tokens // num_channels, 1)"),
        "channels of floor(N / C) tokens instead of ceil(N / C)",
    ),
    M(
        "layout-rdma-counts-ranks",
        "layout.py",
        (
            "num_tokens_per_rdma_rank = per_node.any(dim=2).sum(dim=0).to(torch.int32)",
            "num_tokens_per_rdma_rank = per_node.sum(dim=2).sum(dim=0).to(torch.int32)",
        ),
        "num_tokens_per_rdma_rank counts (token, rank) pairs instead of tokens per node",
    ),
    M(
        "layout-expert-zero-dropped",
        "layout.py",
        ("valid = topk_idx >= 0", "valid = topk_idx > 0"),
        "layout treats expert 0 like -1",
    ),
    M(
        "layout-minus-one-unmasked",
        "layout.py",
        ("dst_rank = torch.where(valid, topk_idx // epr, torch.full_like(topk_idx, -1))", "dst_rank = topk_idx // epr"),
        "layout does not mask -1 before topk_idx // experts_per_rank",
        equivalent="-1 // epr is -1 (floor division), which matches no rank",
    ),
    # ---- internode.py ---------------------------------------------------------------------------------------
    M(
        "inter-one-rounding",
        "internode.py",
        ("acc[node_mask] += partial[node_mask].to(torch.bfloat16).float()", "acc[node_mask] += partial[node_mask]"),
        "internode combine: the per-node partial is not rounded to bf16 (one rounding instead of two)",
    ),
    M(
        "inter-nodes-descending",
        "internode.py",
        ("for n in range(NN):  # nodes ascending", "for n in reversed(range(NN)):"),
        "internode combine adds the node partials in descending node order",
    ),
    M(
        "inter-local-descending",
        "internode.py",
        ("for l in range(G):  # local ranks ascending: the forwarder's sum", "for l in reversed(range(G)):"),
        "internode combine sums a node's local ranks in descending order",
    ),
    M(
        "inter-bias-last",
        "internode.py",
        (
            ("        acc = terms[0] + terms[1]\n", "        acc = torch.zeros_like(terms[0])\n"),
            (
                '        results.append({"combined_x": acc.to(torch.bfloat16)',
                '        acc = acc + (terms[0] + terms[1])\n        results.append({"combined_x": acc.to(torch.bfloat16)',
            ),
        ),
        "internode combine adds the biases after the node partials instead of first",
    ),
    M(
        "inter-weights-rounded",
        "internode.py",
        (
            "w_acc[node_mask] += w_partial[node_mask]",
            "w_acc[node_mask] += w_partial[node_mask].to(torch.bfloat16).float()",
        ),
        "internode combined_topk_weights: the per-node partial rounded to bf16",
    ),
    M(
        "inter-rdma-head-no-channel-restart",
        "internode.py",
        (
            "send_rdma_head = [_channel_stream_positions(h, num_channels) for h in hits]",
            "send_rdma_head = [_stream_positions(h) for h in hits]",
        ),
        "send_rdma_head counts over the whole call instead of restarting in every channel",
    ),
    M(
        "inter-recv-gbl-cpm-no-block-start",
        "internode.py",
        ("        recv_gbl_cpm[1:] += recv_gbl_rank_prefix_sum[:-1].unsqueeze(1)", "        pass"),
        "recv_gbl_channel_prefix_matrix without the source's block start",
    ),
    M(
        "inter-mask-bits-reversed",
        "internode.py",
        (
            "bits = 2 ** torch.arange(G, dtype=torch.int64, device=dev)",
            "bits = 2 ** torch.arange(G, dtype=torch.int64, device=dev).flip(0)",
        ),
        "recv_src_meta mask bit l for local rank G - 1 - l",
    ),
    M(
        "inter-alignment-round-up-extra",
        "internode.py",
        ("[(int(c) + a - 1) // a * a for c in counts]", "[(int(c) + a) // a * a for c in counts]"),
        "expert_alignment rounds an exact multiple up by one more alignment",
    ),
    M(
        "inter-forwarder-by-node",
        "internode.py",
        (
            "fwd = (all_hits[:, m] & (all_src % G == j)).nonzero().flatten()",
            "fwd = (all_hits[:, m] & (all_src // G == j)).nonzero().flatten()",
        ),
        "forwarder takes the tokens of node j instead of its rail peers (local rank j)",
    ),
)


# ----------------------------------------------------------------------------------------
# Applying and running
# ----------------------------------------------------------------------------------------
def apply(mutation: Mutation, text: str) -> str:
    """The mutated source; ValueError when an edit's text does not occur exactly once (the list is stale)."""
    for old, new in mutation.edits:
        n = text.count(old)
        if n != 1:
            raise ValueError(
                f"mutation {mutation.name}: {old!r} occurs {n} times in {REF}/{mutation.file} "
                f"(must be exactly once: update MUTATIONS)"
            )
        text = text.replace(old, new)
    try:  # a mutant must be a program: one that does not compile would be "killed" for nothing
        compile(text, f"{REF}/{mutation.file}", "exec")
    except SyntaxError as e:
        raise ValueError(f"mutation {mutation.name} does not compile: {e}") from None
    return text


def check_list(root: Path = ROOT) -> list[str]:
    """Problems with MUTATIONS against the sources under root: duplicate names, stale edits, unknown files."""
    problems, seen = [], set()
    for m in MUTATIONS:
        if m.name in seen:
            problems.append(f"duplicate mutation name {m.name}")
        seen.add(m.name)
        path = root / REF / m.file
        if not path.is_file():
            problems.append(f"mutation {m.name}: no file {REF}/{m.file}")
            continue
        try:
            if apply(m, path.read_text(encoding="utf-8")) == path.read_text(encoding="utf-8"):
                problems.append(f"mutation {m.name} changes nothing")
        except ValueError as e:
            problems.append(str(e))
    return problems


def make_scratch(tests) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="ep_rt_mutants_"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    files = [t.split("::")[0] for t in tests]  # (a test may be a pytest node id)
    inits = [str(d / "__init__.py") for f in files for d in Path(f).parents if (ROOT / d / "__init__.py").is_file()]
    # the helper modules beside the test files (e.g. tests/reference/exact.py), which they import
    helpers = sorted(
        {
            str(h.relative_to(ROOT))
            for f in files
            for h in (ROOT / f).parent.glob("*.py")
            if not h.name.startswith("test_")
        }
    )
    for rel in COPIED + tuple(inits) + tuple(helpers) + tuple(files):
        src, dst = ROOT / rel, scratch / rel
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copy2(src, dst)
    return scratch


def run_tests(scratch: Path, tests) -> tuple[int, list[str], str]:
    """(pytest exit code, failing test ids, output tail) for the reference tests run in scratch."""
    env = dict(os.environ, PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=no", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, ["(timed out)"], ""
    out = proc.stdout + proc.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    return proc.returncode, failed, out[-2000:]


def check_scratch_imports_copy(scratch: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1")
    got = subprocess.run(
        [sys.executable, "-c", "import ep_rt.reference as r; print(r.__file__)"],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not got or not Path(got).resolve().is_relative_to(scratch.resolve()):
        raise SystemExit(f"the scratch copy does not import its own ep_rt (got {got!r}): cannot test mutants")


@dataclass
class Result:
    mutation: Mutation
    killed: bool
    failed: list
    rc: int
    seconds: float

    @property
    def verdict(self) -> str:
        if self.mutation.equivalent:
            return "equivalent, killed (!)" if self.killed else "equivalent, survives"
        if self.killed and not any("::" in f for f in self.failed):
            return "killed (no test ran)"  # collection or import error: the tests never looked at a result
        return "killed" if self.killed else "SURVIVES"


def run(mutations, tests) -> list[Result]:
    scratch = make_scratch(tests)
    try:
        check_scratch_imports_copy(scratch)
        rc, failed, tail = run_tests(scratch, tests)
        if rc != 0:
            raise SystemExit(f"the unmutated reference fails its own tests (exit {rc}):\n{tail}")
        results = []
        for m in mutations:
            path = scratch / REF / m.file
            original = path.read_text(encoding="utf-8")
            path.write_text(apply(m, original), encoding="utf-8")
            t0 = time.monotonic()
            try:
                rc, failed, _ = run_tests(scratch, tests)
            finally:
                path.write_text(original, encoding="utf-8")
            # rc 1: tests failed; rc 2: collection errors or interruption (an import-time error counts as caught)
            results.append(Result(m, rc != 0, failed, rc, time.monotonic() - t0))
            print(f"  {m.name:<40} {results[-1].verdict:<24} {len(failed):>3} failing", file=sys.stderr, flush=True)
        return results
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------
def short_test(node: str) -> str:
    return node.split("/")[-1].replace(".py::", "::")


def killed_by(r: Result, most: int = 2) -> str:
    if not r.failed:
        return "(exit %d)" % r.rc if r.killed else "-"
    names = [short_test(n) for n in r.failed]
    more = f" (+{len(names) - most} more)" if len(names) > most else ""
    return ", ".join(f"`{n}`" for n in names[:most]) + more


DOC_HEAD = """# Mutations of the reference

The plain-torch reference (`ep_rt/reference/`) is the oracle the GPU kernels are compared against bit for bit, so
a wrong reference would pass wrong kernels. `tools/mutate_reference.py` changes one operator, rounding, order or
offset of it at a time (in a scratch copy), runs the reference's CPU tests (`tests/reference/test_reference*.py`)
against the mutant and records whether some test fails ("killed"). The table below is written by
`python tools/mutate_reference.py --write-doc docs/REFERENCE_MUTATIONS.md` from the tool's mutation list, which
is its single source (`tests/tools/test_reference_mutations.py` checks that this table and the list agree and that
every mutation still applies to the sources). "Killed by" names the first failing tests of the recorded run.

An *equivalent* mutation changes the code but cannot change any result the reference is used for; the reason is
given with it. Every other mutation must be killed.
"""


def write_doc(results, path: Path, tests) -> None:
    lines = [
        DOC_HEAD,
        f"Recorded run: {len(results)} mutations against {', '.join(f'`{t}`' for t in tests)}.\n",
        "| mutation | file | change | result | killed by |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r.mutation.name}` | {r.mutation.file} | {r.mutation.what.replace('|', '/')} | "
            f"{r.verdict} | {killed_by(r)} |"
        )
    eq = [r for r in results if r.mutation.equivalent]
    if eq:
        lines += ["", "## Why the equivalent ones are equivalent", ""]
        lines += [f"- `{r.mutation.name}`: {r.mutation.equivalent}." for r in eq]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    ap.add_argument(
        "--tests",
        nargs="+",
        default=list(DEFAULT_TESTS),
        help="test files or pytest node ids, relative to the repository",
    )
    ap.add_argument("--write-doc", type=Path, metavar="PATH", help="write the markdown table to PATH")
    ap.add_argument("--list", action="store_true", help="list the mutations and check they apply, run nothing")
    args = ap.parse_args(argv)
    problems = check_list()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    mutations = list(MUTATIONS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTATIONS})
        if unknown:
            print(f"unknown mutation(s): {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutations = [m for m in MUTATIONS if m.name in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.name:<40} {m.file:<15} {m.what}{'  [equivalent]' if m.equivalent else ''}")
        return 0
    if args.write_doc and args.only:
        print("--write-doc records the whole list: leave out --only", file=sys.stderr)
        return 2
    results = run(mutations, args.tests)
    print(f"{'mutation':<40} {'result':<24} killed by")
    for r in results:
        print(f"{r.mutation.name:<40} {r.verdict:<24} {killed_by(r, most=3).replace('`', '')}")
    bad = [r for r in results if r.verdict in ("SURVIVES", "equivalent, killed (!)", "killed (no test ran)")]
    print(
        f"\n{sum(r.killed for r in results)} of {len(results)} killed; "
        f"{sum(1 for r in results if r.verdict == 'SURVIVES')} semantic mutation(s) survive; "
        f"{sum(1 for r in results if r.mutation.equivalent)} marked equivalent"
    )
    if args.write_doc:
        write_doc(results, args.write_doc, args.tests)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
