"""The NVSHMEM environment a low-latency Buffer sets: DeepEP's, minus the remote transports (IBGDA included) when
every rank is on one host, unless EP_RT_NVSHMEM_DEBUG=1 asks for DeepEP's settings and NVSHMEM's warnings."""

import os

import pytest

from ep_rt.transport import nvshmem

KEYS = (
    "NVSHMEM_DISABLE_P2P",
    "NVSHMEM_IB_ENABLE_IBGDA",
    "NVSHMEM_IBGDA_NUM_RC_PER_PE",
    "NVSHMEM_QP_DEPTH",
    "NVSHMEM_MAX_TEAMS",
    "NVSHMEM_DISABLE_NVLS",
    "NVSHMEM_CUMEM_GRANULARITY",
    "NVSHMEM_DISABLE_MNNVL",
    "NVSHMEM_REMOTE_TRANSPORT",
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
    "NVSHMEM_DEBUG",
    "EP_RT_NVSHMEM_DEBUG",
)


@pytest.fixture(autouse=True)
def clean_env():
    """Without the keys (and ep_rt's record of what it wrote), and os.environ restored afterwards: set_environment
    writes variables that would otherwise leak into later tests and the processes they start."""
    saved = dict(os.environ)
    for k in (*KEYS, nvshmem.network_settings.RECORD):
        os.environ.pop(k, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_one_host_asks_for_no_remote_transport():
    assert nvshmem.set_environment(8, True, False, single_host=True) == 1024
    assert os.environ["NVSHMEM_IB_ENABLE_IBGDA"] == "0"  # the source of "init failed for transport: IBGDA"
    assert os.environ["NVSHMEM_REMOTE_TRANSPORT"] == "none"
    assert "NVSHMEM_DEBUG" not in os.environ
    assert os.environ["NVSHMEM_DISABLE_P2P"] == "0" and os.environ["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "8"


def test_debug_knob_brings_deepeps_settings_back(monkeypatch):
    monkeypatch.setenv("EP_RT_NVSHMEM_DEBUG", "1")
    nvshmem.set_environment(8, True, False, single_host=True)
    assert os.environ["NVSHMEM_IB_ENABLE_IBGDA"] == "1" and os.environ["NVSHMEM_DEBUG"] == "WARN"


def test_debug_knob_keeps_a_users_nvshmem_debug(monkeypatch):
    monkeypatch.setenv("EP_RT_NVSHMEM_DEBUG", "1")
    monkeypatch.setenv("NVSHMEM_DEBUG", "INFO")
    nvshmem.set_environment(8, True, False, single_host=True)
    assert os.environ["NVSHMEM_DEBUG"] == "INFO"


@pytest.mark.parametrize("single_host,allow_nvlink", [(False, True), (True, False)])
def test_remote_peers_keep_deepeps_ibgda(single_host, allow_nvlink):
    nvshmem.set_environment(4, allow_nvlink, False, single_host=single_host)
    assert os.environ["NVSHMEM_IB_ENABLE_IBGDA"] == "1"
    assert "NVSHMEM_REMOTE_TRANSPORT" not in os.environ
    assert os.environ["NVSHMEM_DISABLE_P2P"] == ("0" if allow_nvlink else "1")
