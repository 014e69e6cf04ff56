"""python -m ep_rt model: predicted internode high-throughput times and DeepEP's bandwidth metrics on a real cluster
(NIC and NVLink bandwidth, node count, ranks per node), next to DeepEP's published numbers. A model, not a
measurement: ep_rt's internode kernels do not exist yet (docs/INTERNODE_DESIGN.md)."""
from __future__ import annotations


def main(argv=None) -> int:
    from ..testing import internode_model

    return internode_model.main(argv)
