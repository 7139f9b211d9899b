"""MTP's methods of the command line, the benchmark and the app: none yet, as no model of the offline registry has
MTP layers (DeepSeek-V3 and GLM-4.5 are far larger than the registry's models).

How ``METHODS`` and its builds are read and called: :mod:`hf_speculative.tooling.methods`.
"""

from __future__ import annotations

METHODS: list = []
