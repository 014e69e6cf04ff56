"""Shipped checks and benchmarks (python -m ep_rt uses them): rank spawning, the bit-exact checker, the HT and LL
self-checks against ep_rt.reference, the LL soak, the benchmarks, the internode performance model (internode_model,
pipeline_model, network_ops: pure Python, behind python -m ep_rt model). Imports the public API and the reference; the
runtime package never imports this."""
