"""How a kernel runs, knowing nothing about experts or ranks: the driver (the only module that imports
cuda.bindings), the cubin manifest, module lookup and loading, launches, and the ctypes mirrors of params.h.
Imports only ep_rt.errors, ep_rt.env and itself."""
