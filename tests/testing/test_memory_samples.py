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


def _with_counts(fds_rise, events_rise):
    return [
        memory.Sample(
            i * 100, 10 * MB, 0, 0, 500 * MB, 0, 0, 40 + (fds_rise if i >= 5 else 0), 3 + (events_rise if i >= 5 else 0)
        )
        for i in range(10)
    ]


def test_one_more_open_file_or_live_event_is_a_leak_under_the_call_soaks_bounds():
    from ep_rt.testing import soak_calls

    assert memory.leaks(_with_counts(0, 0), gpu_shared=True, limits=soak_calls.BOUNDS) == []
    found = memory.leaks(_with_counts(1, 1), gpu_shared=True, limits=soak_calls.BOUNDS)
    assert found == [
        "open_fds grew by 1 after the warm-up (limit 0)",
        "cuda_events grew by 1 after the warm-up (limit 0)",
    ]
    rss = memory.leaks(samples(host_rss=17 * MB), gpu_shared=True, limits=soak_calls.BOUNDS)
    assert rss == ["host_rss grew by 17.0 MiB after the warm-up (limit 16)"]  # the call soak's bound, not 256 MiB


def test_open_fds_and_cuda_events_are_counted(tmp_path, monkeypatch):
    import torch

    before = memory.open_fds()
    with open(tmp_path / "f", "w"):
        assert memory.open_fds() == before + 1

    class Event:  # stands in for torch.cuda.Event (no CUDA here)
        pass

    monkeypatch.setattr(torch.cuda, "Event", Event)
    kept = [Event() for _ in range(3)]
    assert memory.cuda_events() == 3
    del kept
    assert memory.cuda_events() == 0


def test_the_call_soak_counts_differing_words():
    import torch

    from ep_rt.testing import soak_calls

    a = torch.arange(8, dtype=torch.bfloat16)
    b = a.clone()
    b[3], b[5] = -1, 7
    assert int(soak_calls._differs(a, a)) == 0 and int(soak_calls._differs(a, b)) == 2  # one bf16 = one word
    f = torch.ones(4, dtype=torch.float32)
    assert int(soak_calls._differs(f, -f)) == 4  # f32: two words each, only the sign word differs
    assert soak_calls._samples_problems(samples(), 2, 5, 6) == [
        "2 output words differed from the first round's",
        "stopped after 5 of 6 rounds",
    ]
