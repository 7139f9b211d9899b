"""The team's GPU check (``make gpu-check``, docs/gpu.md): the runner, its real-weights step and the synthetic
drafter its end-to-end timings use. Not part of the package: it runs the repository's device battery
(tests/test_device.py), so it lives beside the tests; run it from the clone's root:
``python -m tools.gpu.gpu_check``."""
