"""CPU tests of ep_rt.reference: the plain-torch oracle the kernels are compared against."""
