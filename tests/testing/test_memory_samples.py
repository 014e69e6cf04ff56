"""The soaks' leak check (ep_rt.testing.memory): growth after the warm-up, per-process measures always, device-wide
ones only when the process has its GPU to itself."""

from ep_rt.testing import memory

MB = 1 << 20


def samples(**rises):
    out = []
    for i in range(10):
        grow = {k: (v if i >= 5 else 0) for k, v in rises.items()}
        out.append(
            memory.Sample(
                i * 100,
                10 * MB + grow.get("torch_allocated", 0),
                1000 * MB + grow.get("device_used", 0),
                0,
                500 * MB + grow.get("host_rss", 0),
                300 * MB + grow.get("ep_rt_device", 0),
                4096,
            )
        )
    return out


def test_flat_is_clean():
    assert memory.leaks(samples(), gpu_shared=False) == []


def test_per_process_growth_is_a_leak_even_on_a_shared_gpu():
    found = memory.leaks(samples(ep_rt_device=2 * MB, host_rss=300 * MB), gpu_shared=True)
    assert any("ep_rt_device" in f for f in found) and any("host_rss" in f for f in found)


def test_device_wide_growth_counts_only_on_an_unshared_gpu():
    s = samples(device_used=600 * MB)
    assert memory.leaks(s, gpu_shared=True) == []
    assert any("device_used" in f for f in memory.leaks(s, gpu_shared=False))


def test_warm_up_growth_is_not_a_leak():
    s = samples()
    s[0] = memory.Sample(0, 0, 0, 0, 0, 0, 0)  # before the warm-up ended: anything goes
    assert memory.leaks(s, gpu_shared=False) == []
