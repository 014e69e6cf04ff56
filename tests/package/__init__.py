"""CPU tests of The package as shipped and used: wheel, requirements, quiet import, drop-in behaviour, deep_ep alias, import layering, CI command, documented knobs."""
