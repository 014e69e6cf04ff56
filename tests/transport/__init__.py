"""CPU tests of ep_rt.transport: agreement, host waits, layouts, NVSHMEM, network settings and rules, chaos transport, topology."""
