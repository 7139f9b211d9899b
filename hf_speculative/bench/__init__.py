"""Spec-Bench style benchmark: :mod:`.runner` times decoding methods, :mod:`.report` summarises them."""
