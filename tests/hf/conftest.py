"""The edge-case matrix of ``test_integration.py`` rotated over the architectures for the second transformers version.

Every edge case (EOS, stop strings, custom criteria and ``max_new_tokens`` inside a draft; logits processors) runs
every drafter on every architecture: on one transformers version that is the check. CI runs the newest 4.x too, where
what differs is transformers' side (its caches, masks, assisted loop and stopping criteria), not the drafter's. There
the cells marked ``arch_rotated`` are left out: a cell keeps its architecture when ``(drafter + case + test) % archs``
picks it, so on 4.x each drafter still meets each edge case in both loops on some architecture, each architecture
meets every drafter across the cases, and ``test_greedy_identity`` still runs every drafter on every architecture.
"""

from __future__ import annotations

import pytest

from tests.conftest import ARCHS, DRAFTERS

# test_integration.py's every item as collected (test, parameters, whether rotated), for test_arch_rotation.py: the
# session's own collection, where it collected the whole module
MATRIX = pytest.StashKey[list]()

# the edge-case tests, in the order that offsets their rotations; their other parameters shift it further
ROTATED = ("test_eos_inside_a_draft", "test_max_new_tokens_inside_a_draft", "test_stop_strings",
           "test_custom_stopping_criterion_on_a_token", "test_custom_stopping_criterion_on_length",
           "test_logits_processors")


def kept_arch(test: str, params: dict, archs: list, cases: dict) -> str:
    """The architecture a cell of ``test`` with ``params`` (its drafter and other parameters) keeps on 4.x; ``archs``
    and ``cases`` (each other parameter's values) in the order they were collected."""
    offset = DRAFTERS.index(params["drafter_name"]) + ROTATED.index(test)
    offset += sum(cases[name].index(params[name]) for name in sorted(set(params) - {"drafter_name", "arch"}))
    return archs[offset % len(archs)]


def pytest_collection_modifyitems(config, items):
    cells = {}  # test name -> its items of the matrix
    for item in items:
        spec = getattr(item, "callspec", None)
        name = getattr(item, "originalname", item.name)
        if (spec is not None and name in ROTATED and item.path.name == "test_integration.py"
                and {"arch", "drafter_name"} <= set(spec.params)):  # (a conftest's hook sees every folder's items)
            cells.setdefault(name, []).append(item)
    for name, group in cells.items():
        archs = [arch for arch in ARCHS if any(item.callspec.params["arch"] == arch for item in group)]
        cases = {}
        for item in group:
            for key, value in item.callspec.params.items():
                if key not in ("arch", "drafter_name") and value not in cases.setdefault(key, []):
                    cases[key].append(value)
        for item in group:
            if item.callspec.params["arch"] != kept_arch(name, item.callspec.params, archs, cases):
                item.add_marker(pytest.mark.arch_rotated)
    # before `-m`/`-k` deselect anything (pytest's own hooks run after a conftest's): every item of the module. The
    # key is the one of this file imported as `tests.hf.conftest`, as test_arch_rotation.py imports it (pytest loads
    # a conftest of a folder without __init__.py as another module, whose key would be another object)
    from tests.hf.conftest import MATRIX as matrix_key

    config.stash[matrix_key] = matrix_rows(items)


def matrix_rows(items) -> list[dict]:
    """test_integration.py's items among ``items``: each one's test, parameters (as ``repr``) and whether it carries
    ``arch_rotated`` (also what test_arch_rotation.py's subprocess collection writes)."""
    return [{"test": getattr(item, "originalname", item.name),
             "params": {key: repr(value) for key, value in item.callspec.params.items()}
             if hasattr(item, "callspec") else {},
             "rotated": item.get_closest_marker("arch_rotated") is not None}
            for item in items if item.path.name == "test_integration.py" and item.path.parent.name == "hf"]
