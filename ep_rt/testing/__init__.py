"""Shipped checks and benchmarks (python -m ep_rt uses them): rank spawning, the bit-exact checker, the HT and LL
self-checks against ep_rt.reference, the LL soak, the benchmarks. Imports the public API and the reference; the
runtime package never imports this."""
