"""CPU tests of ep_rt.runtime and the kernel interface: abi mirrors of params.h, struct fields, launches, cubin choice, error decoding."""
