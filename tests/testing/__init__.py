"""CPU tests of ep_rt.testing: checkers, self-checks, soaks, the bad-input catalogue, benchmark parsing, models."""
