"""CPU tests of ep_rt.cli: python -m ep_rt's commands (help, doctor, bench, tune, model) and the install table."""
