"""CPU tests of The API modules (config, config tables, handles, events, validate): what a caller hands in and gets back."""
