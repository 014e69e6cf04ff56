"""ep_rt.reference_ll, as before the reference became a package: the low-latency and LogFMT oracles."""

from .reference.logfmt import (  # noqa: F401 (re-exported names)
    LOGFMT_DIVISION,
    LOGFMT_MAX_CODE,
    LOGFMT_MAX_LOG_RANGE,
    LOGFMT_NUM_STEPS,
    logfmt_decode,
    logfmt_encode,
    logfmt_params,
    logfmt_roundtrip,
)
from .reference.low_latency import _position_in_block, low_latency_combine, low_latency_dispatch  # noqa: F401

__all__ = ["low_latency_dispatch", "low_latency_combine", "logfmt_encode", "logfmt_decode", "logfmt_roundtrip"]
