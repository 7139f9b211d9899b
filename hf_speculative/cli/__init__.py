"""The command line (`hf-speculative`; the [cli] extra)."""
