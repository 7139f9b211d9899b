"""The team's own tooling: corpus builders and experiment scripts (not part of the package, not installed).

Run from a clone of the repository, in its root, with the package installed (``pip install -e .``):
``python -m tools.prompts --help``.
"""
