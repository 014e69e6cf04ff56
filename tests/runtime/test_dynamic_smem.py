"""modules.requested_dynamic_smem: a kernel's dynamic shared memory comes from its module's `<kernel>_dynamic_smem`
(a u32 the source declares beside a path that needs it), 0 when the module has none (the driver's
CUDA_ERROR_NOT_FOUND), and any other driver error or a wrong size is raised, never read as 0; the intranode op
launches each of its kernels with what the module asks for it, and the Launcher raises the kernel's limit above
48 KiB."""

import pytest

from ep_rt.errors import CubinNotFoundError, CudaDriverError
from ep_rt.runtime import abi, driver, launch, modules


class _Module:
    def __init__(self, globals_):
        self.entry = {"path": "x.cubin", "blocks": {"ep_rt_intranode_dispatch": 512}}
        self.globals = globals_

    def global_address(self, name):
        if name not in self.globals:
            raise CudaDriverError(f"cuModuleGetGlobal({name}) failed: CUDA_ERROR_NOT_FOUND (named symbol not found)")
        return self.globals[name]

    def function(self, name):
        return f"function {name}"


class _Nvl:
    device_index = 0

    def fill_common(self, params):
        pass


def _intranode_op(monkeypatch, module):
    """IntranodeOp over `module` (an intranode entry with the three kernels' blocks), no GPU."""
    from ep_rt.ops import intranode

    module.entry["blocks"].update(ep_rt_intranode_notify=1024, ep_rt_intranode_combine=512)
    monkeypatch.setattr(modules, "load_family", lambda device, family: module)
    monkeypatch.setattr(driver, "set_max_dynamic_smem", lambda f, n: None)
    return intranode.IntranodeOp(_Nvl())


def test_a_module_without_the_symbol_asks_for_none(monkeypatch):
    monkeypatch.setattr(driver, "memcpy_dtoh", lambda ptr, n: pytest.fail("nothing to read"))
    assert modules.requested_dynamic_smem(_Module({}), "ep_rt_intranode_dispatch") == 0


def test_the_value_is_read_from_the_module(monkeypatch):
    read = []
    monkeypatch.setattr(driver, "memcpy_dtoh", lambda ptr, n: read.append((ptr, n)) or (131072).to_bytes(4, "little"))
    module = _Module({"ep_rt_intranode_dispatch_dynamic_smem": (0x7000, 4)})
    assert modules.requested_dynamic_smem(module, "ep_rt_intranode_dispatch") == 131072
    assert read == [(0x7000, 4)]


def test_a_wrong_size_or_another_driver_error_is_raised():
    with pytest.raises(CubinNotFoundError, match="has 8 bytes, expected a u32"):
        modules.requested_dynamic_smem(_Module({"k_dynamic_smem": (0x7000, 8)}), "k")

    class Broken(_Module):
        def global_address(self, name):
            raise CudaDriverError("cuModuleGetGlobal(k_dynamic_smem) failed: CUDA_ERROR_INVALID_CONTEXT (invalid)")

    with pytest.raises(CudaDriverError, match="INVALID_CONTEXT"):
        modules.requested_dynamic_smem(Broken({}), "k")


def test_the_launcher_raises_the_limit_for_more_than_48_kib(monkeypatch):
    raised = []
    monkeypatch.setattr(driver, "set_max_dynamic_smem", lambda f, n: raised.append((f, n)))
    module = _Module({})
    small = launch.Launcher(module, "ep_rt_intranode_dispatch", abi.DispatchParams, smem=0)
    big = launch.Launcher(module, "ep_rt_intranode_dispatch", abi.DispatchParams, smem=131072)
    assert (small.smem, big.smem) == (0, 131072)
    assert raised == [("function ep_rt_intranode_dispatch", 131072)]


def test_the_intranode_op_launches_each_kernel_with_what_the_module_asks_for_it(monkeypatch):
    """Each kernel gets its own `<kernel>_dynamic_smem` (the value read from the symbol's address), and a kernel
    without one gets none, whatever its neighbours ask."""
    values = {0x9000: 131072, 0xA000: 196608}
    monkeypatch.setattr(driver, "memcpy_dtoh", lambda ptr, n: values[ptr].to_bytes(4, "little"))
    asked = {}
    for case, globals_ in (
        ("none", {}),
        ("dispatch", {"ep_rt_intranode_dispatch_dynamic_smem": (0x9000, 4)}),
        ("combine", {"ep_rt_intranode_combine_dynamic_smem": (0xA000, 4)}),
        (
            "both",
            {
                "ep_rt_intranode_dispatch_dynamic_smem": (0x9000, 4),
                "ep_rt_intranode_combine_dynamic_smem": (0xA000, 4),
            },
        ),
    ):
        module = _Module(globals_)
        module.entry["variant"] = "tma"
        op = _intranode_op(monkeypatch, module)
        asked[case] = (op.dispatch_kernel.smem, op.combine_kernel.smem, op.notify.smem)
    assert asked == {
        "none": (0, 0, 0),
        "dispatch": (131072, 0, 0),
        "combine": (0, 196608, 0),
        "both": (131072, 196608, 0),
    }


def test_every_variant_is_asked_and_one_without_the_symbol_gets_none(monkeypatch):
    """The safe and aggressive builds are asked too (a build that moves the bulk loads there needs no runtime
    change); the shipped ones declare nothing, so their launches get no dynamic shared memory."""
    values = {0xA000: 196608}
    monkeypatch.setattr(driver, "memcpy_dtoh", lambda ptr, n: values[ptr].to_bytes(4, "little"))
    for variant in ("safe", "aggressive"):
        module = _Module({})
        module.entry.update(variant=variant)
        op = _intranode_op(monkeypatch, module)
        assert (op.dispatch_kernel.smem, op.combine_kernel.smem) == (0, 0)
        module = _Module({"ep_rt_intranode_combine_dynamic_smem": (0xA000, 4)})
        module.entry.update(variant=variant)
        op = _intranode_op(monkeypatch, module)
        assert (op.dispatch_kernel.smem, op.combine_kernel.smem) == (0, 196608)


SM90_MAX_SMEM_PER_BLOCK = 232448  # 227 KiB: what an sm_90 block may opt in to (static + dynamic)


def test_only_the_tma_combine_asks_for_dynamic_smem_and_sm90_can_give_it():
    """The shipped cubins that declare a `<kernel>_dynamic_smem` are the two sm_90 tma intranode cubins, for the
    combine's bulk-load stages (docs/experiments/applied/ht_tma_combine.patch): a u32 of 196608 bytes in constant
    memory, which with the kernel's static shared memory stays within what sm_90 gives one block (else the launch
    would fail). Every other cubin's launches get no dynamic shared memory this way."""
    from ..repo import REPO, load_tool

    elf = load_tool("build_cubins.py", "_build_cubins_smem")
    asked = {}
    for cubin in sorted((REPO / "cubins").rglob("*.cubin")):
        data = cubin.read_bytes()
        headers = {name: (offset, size) for name, _, offset, size, _ in elf.elf_section_headers(data)}
        for name, (section, value, size) in elf.elf_symbols(data).items():
            if name.endswith("_dynamic_smem"):
                assert size == 4 and section.startswith(".nv.constant"), (cubin, name, section, size)
                offset = headers[section][0] + value
                kernel = name[: -len("_dynamic_smem")]
                static = headers.get(f".nv.shared.{kernel}", (0, 0))[1]  # NOBITS: its size is the static smem
                asked[str(cubin.relative_to(REPO / "cubins"))] = (
                    kernel,
                    int.from_bytes(data[offset : offset + 4], "little"),
                    static,
                )
    assert sorted(asked) == ["cu12/sm_90/tma/intranode.cubin", "cu13/sm_90/tma/intranode.cubin"]
    for path, (kernel, dynamic, static) in asked.items():
        assert (kernel, dynamic) == ("ep_rt_intranode_combine", 196608), path
        assert 0 < static and dynamic + static <= SM90_MAX_SMEM_PER_BLOCK, (path, static)
