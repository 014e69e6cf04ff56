"""CPU tests of ep_rt.ops: the ops' argument checks and the parameters they pack."""
