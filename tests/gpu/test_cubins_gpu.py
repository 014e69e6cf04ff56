"""Every cubin in the manifest that this GPU and driver can run loads (both flavours where the driver allows), and
every kernel it lists resolves."""

import pytest
import torch

from ep_rt.runtime import choice, driver, modules as cubins

pytestmark = pytest.mark.smoke


def test_every_runnable_manifest_cubin_loads_and_its_kernels_resolve():
    torch.cuda.init()
    dev = torch.cuda.current_device()
    cc, version = driver.compute_capability(dev), driver.driver_version()
    entries = [
        e
        for e in cubins.manifest()["cubins"]
        if choice.arch_distance(e["arch"], cc) is not None and e["min_driver"] <= version
    ]
    assert entries, f"no cubins for {cubins.arch_of(dev)}"
    for entry in entries:
        module = cubins.load_entry(dev, entry)
        for name in entry["kernels"]:
            assert module.function(name) is not None, (entry["path"], name)
        driver.module_unload(module.handle)


def test_missing_arch_is_a_clear_error():
    manifest = cubins.manifest()
    with pytest.raises(cubins.CubinNotFoundError, match="it has cu12: "):
        choice.choose_entry(manifest, "intranode", (4, 2), False, driver.driver_version())
