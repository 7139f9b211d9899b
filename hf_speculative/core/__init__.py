"""The core: one loop, the acceptance rule, trees, verification, costs, per-model state, statistics."""
