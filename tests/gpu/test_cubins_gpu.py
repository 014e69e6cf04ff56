"""Every cubin in the manifest loads on this GPU and every kernel it lists resolves."""
import pytest
import torch

from ep_rt.runtime import modules as cubins


def test_every_manifest_cubin_loads_and_its_kernels_resolve():
    torch.cuda.init()
    dev = torch.cuda.current_device()
    arch = cubins.arch_of(dev)
    entries = [e for e in cubins.manifest()["cubins"] if e["arch"] == arch]
    assert entries, f"no cubins for {arch}"
    for entry in entries:
        module = cubins.load_entry(dev, entry)
        for name in entry["kernels"]:
            assert module.function(name) is not None
        from ep_rt.runtime import driver as _driver
        _driver.module_unload(module.handle)


def test_missing_arch_is_a_clear_error():
    manifest = cubins.manifest()
    with pytest.raises(cubins.CubinNotFoundError, match="has cubins for"):
        cubins.choose_entry(manifest, "intranode", "sm_42", aggressive=False)
