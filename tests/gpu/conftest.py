import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine; see docs/GPU_RESULTS.md)")
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def gpus(n):
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return pytest.mark.skipif(have < n, reason=f"needs {n} GPUs, found {have}")
