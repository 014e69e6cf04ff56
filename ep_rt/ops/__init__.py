"""The operations Buffer exposes, one module per kernel family (layout, intranode, low_latency) plus the argument
checks of the high-throughput calls (ht_args). An op checks its arguments, fills its kernels' parameters and
launches; it owns no resources (the transports it is given do). Ops never import each other."""
