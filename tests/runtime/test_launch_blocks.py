"""Every Launcher takes its block size from the manifest entry of its cubin (what tools/build_cubins.py read from the
compiled kernel's __launch_bounds__): no caller names one, a missing one is a clear error, and the ops' grid
arithmetic reads the launcher's. That the values are the ones launched before is tests/buffer/test_host_trace.py's
(every launch's block against the golden trace); that the manifest matches the kernels, tests/tools/test_kernel_blocks.py's."""

import ast
import inspect

import pytest
import torch

from ep_rt.errors import CubinNotFoundError
from ep_rt.ops.layout import LayoutOp
from ep_rt.runtime import abi, launch, modules

from ..ops.test_topk_idx_bits import ll_op
from ..package.test_dropin import FakeLauncher
from ..repo import REPO


class _Module:
    def __init__(self, entry):
        self.entry = entry

    def function(self, name):
        return f"function {name}"


class _Stream:
    cuda_stream = 77


def test_the_launcher_launches_with_the_manifest_block(monkeypatch):
    calls = []
    monkeypatch.setattr(launch.driver, "make_stream", lambda handle: handle)
    monkeypatch.setattr(launch.driver, "launch", lambda f, grid, block, *rest: calls.append((f, grid, block)))
    k = launch.Launcher(_Module({"path": "x.cubin", "blocks": {"k": 96, "other": 1024}}), "k", abi.LayoutParams)
    assert k.block == 96
    k(5, _Stream())
    k.snapshot()(6, _Stream())
    assert calls == [("function k", 5, 96), ("function k", 6, 96)]


@pytest.mark.parametrize(
    "entry",
    [
        {"path": "x.cubin"},  # a manifest from before block sizes were recorded
        {"path": "x.cubin", "blocks": {"other": 256}},  # a kernel without __launch_bounds__
        {"path": "x.cubin", "blocks": {"k": 0}},
        {"path": "x.cubin", "blocks": {"k": True}},
        {"path": "x.cubin", "blocks": {"k": "256"}},
    ],
)
def test_a_missing_block_size_is_a_clear_error(entry):
    with pytest.raises(CubinNotFoundError) as info:
        launch.Launcher(_Module(entry), "k", abi.LayoutParams)
    text = str(info.value)
    assert "'x.cubin' has no block size for kernel 'k'" in text and "python tools/build_cubins.py" in text


def test_no_caller_names_a_block_size():
    """The Launcher takes no block argument, no ep_rt module passes one or keeps a *BLOCK* constant."""
    assert "block" not in inspect.signature(launch.Launcher).parameters
    found = []
    for path in sorted((REPO / "ep_rt").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Launcher":
                found += [
                    f"{path.name}:{node.lineno}: Launcher(..., {kw.arg}=)"
                    for kw in node.keywords
                    if kw.arg in ("block", "block_dim", "threads")
                ]
                if len(node.args) > 3:
                    found.append(f"{path.name}:{node.lineno}: Launcher with {len(node.args)} positional arguments")
        found += [f"{path.name}:{line}: {name} =" for line, name in block_constants(tree)]
    assert found == []


def block_constants(tree):
    """(line, name) of the module- and class-level constants named like a block size (_BLOCK, _SEND_BLOCK)."""
    bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    out = []
    for node in (n for body in bodies for n in body if isinstance(n, (ast.Assign, ast.AnnAssign))):
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            out += [
                (node.lineno, n.id)
                for n in ast.walk(target)
                if isinstance(n, ast.Name) and n.id.strip("_").isupper() and "BLOCK" in n.id.split("_")
            ]
    return out


def test_the_source_check_sees_a_block_constant():
    """The check above finds the constants of the code before this change, and no local per_block."""
    code = (
        "_SEND_BLOCK, _RECV_BLOCK = 512, 256\n_NOTIFY_BLOCK = 1024\nclass A:\n    _BLOCK = 3\n"
        "def f(n):\n    per_block = n\n    BLOCK = 2\n"
    )
    assert [name for _, name in block_constants(ast.parse(code))] == [
        "_SEND_BLOCK",
        "_RECV_BLOCK",
        "_NOTIFY_BLOCK",
        "_BLOCK",
    ]


def test_kernel_block_reads_the_entry():
    assert modules.kernel_block({"path": "p", "blocks": {"a": 32, "b": 512}}, "b") == 512


def test_the_layout_grid_follows_the_kernel_block(monkeypatch):
    """get_dispatch_layout's grid: four tokens per thread of the kernel's block before another block."""
    from ep_rt.ops import layout as layout_mod

    monkeypatch.setattr(layout_mod, "driver_stream", lambda stream: stream)  # (the counts' memset: stood in for)
    monkeypatch.setattr(layout_mod.driver, "memset_d32_async", lambda *args: None)
    grids = {}
    for block in (256, 64):  # a fresh op each (an op keeps its call plans, grid included, per shape)
        op = object.__new__(LayoutOp)
        op.num_sms = 132
        op.kernel = FakeLauncher(abi.LayoutParams, block=block)
        op(torch.zeros(1000, 2, dtype=torch.int64), 8, 2, None, None)
        grids[block] = op.kernel.launches[-1]
    assert grids == {256: 1, 64: 4}  # ceil(1000 / 1024), ceil(1000 / 256)


def test_the_ll_combine_receive_grid_follows_the_kernel_block():
    """Work items of the LL combine receive: (token, chunk of one block's int4 of the row)."""
    R, T, H, E, N, K = 2, 8, 256, 8, 3, 2
    grids = {}
    for block in (256, 8):
        op = ll_op(R, E)
        op.num_sms = 100
        op.kernels["combine_recv"].block = block
        idx = torch.zeros(N, K, dtype=torch.int64)
        (_, _, _, src_info, layout_range), recv = op.dispatch(
            torch.zeros(N, H, dtype=torch.bfloat16), idx, T, E, None, None, False, False, False, None, True
        )
        recv(None)
        _, launch_recv = op.combine(
            torch.zeros(E // R, R * T, H, dtype=torch.bfloat16),
            idx,
            torch.zeros(N, K),
            src_info,
            layout_range,
            T,
            H,
            E,
            None,
            None,
            False,
            False,
            None,
            True,  # the receive kernel, as a hook launches it
        )
        grids[block] = launch_recv.grid
    assert grids == {256: 3, 8: 12}  # 3 tokens x ceil(256 / 2048) chunks; 3 x ceil(256 / 64)
