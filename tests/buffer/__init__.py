"""CPU tests of ep_rt.Buffer and Buffer.runtime (the top wing), on the CPU with stand-ins for the GPU parts."""
