"""Per-model state (``hf_speculative.core.state``): one object per model, filled by the modules that
measure and check, and one ``forget(model)`` that drops all of it for that model and no other."""

from __future__ import annotations

import gc
import threading
import weakref

import torch

import hf_speculative as hfs
from hf_speculative.core.costs import draft_price, record_draft_step, verify_costs_for
from hf_speculative.drafters.self_speculative.calibration import SkipCalibration, cached_calibration, remember_calibration
from hf_speculative.drafters.self_speculative.layer_view import check_structure, layer_subset
from hf_speculative.core.state import ModelState, forget, state_of
from tests.conftest import build_model, random_eagle, random_exit_adapter, sibling_model


def remember_everything(target: torch.nn.Module) -> dict:
    """Fill every slot of ``target``'s state through the modules that own them; what each holds."""
    costs = verify_costs_for(target, 8)
    costs.observe(2, 0.5)
    costs.observe(2, 0.5)
    view = layer_subset(target, [0])
    check_structure(target)
    plan = SkipCalibration(skip=[1], num_layers=2)
    remember_calibration(target, plan)
    draft = sibling_model(target)
    hfs.DraftModel(draft).validate_target(target)
    eagle = random_eagle(target)
    hfs.Eagle(eagle).validate_target(target)
    adapter = random_exit_adapter(target, exit_layer=1)
    hfs.EarlyExit(adapter=adapter).validate_target(target)
    record_draft_step(target, 0.25)  # a model that drafts for another has its own step time
    return {"costs": costs, "view": view, "plan": plan, "checked": [draft, eagle, adapter]}


def assert_remembered(target: torch.nn.Module, held: dict) -> None:
    state = state_of(target)
    assert verify_costs_for(target, 8) is held["costs"] and held["costs"].seconds(2) == 0.5
    assert layer_subset(target, [0]) is held["view"]
    assert state.structure_problem == ""  # probed, and fine
    assert cached_calibration(target) is held["plan"]
    assert all(net in state.checked for net in held["checked"])
    assert state.draft_step_s == 0.25


def test_forget_drops_every_cache_of_that_model_and_no_other():
    first, second = build_model("llama"), build_model("llama", seed=5)
    held_first, held_second = remember_everything(first), remember_everything(second)
    assert_remembered(first, held_first)
    forget(first)

    empty = ModelState()
    state = state_of(first)
    assert (state.verify_costs, state.views, state.structure_problem, state.calibration, state.draft_step_s) == (
        empty.verify_costs, empty.views, empty.structure_problem, empty.calibration, empty.draft_step_s)
    assert len(state.checked) == 0
    assert cached_calibration(first) is None
    fresh = verify_costs_for(first, 8)
    assert fresh is not held_first["costs"] and fresh.seconds(2) is None
    assert layer_subset(first, [0]) is not held_first["view"]
    assert draft_price(first, fresh, None, prior=0.7) == 0.7  # its measured drafting step is gone too
    assert_remembered(second, held_second)  # untouched


def test_forget_of_an_unknown_model_is_a_no_op():
    forget(torch.nn.Linear(2, 2))


def test_one_state_per_model_across_threads():
    model = torch.nn.Linear(2, 2)
    seen, start = [], threading.Barrier(8)

    def get():
        start.wait()
        seen.append(state_of(model))

    threads = [threading.Thread(target=get) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and all(state is seen[0] for state in seen)
    assert state_of(torch.nn.Linear(2, 2)) is not seen[0]


def test_a_model_is_not_kept_alive_by_its_state():
    model = torch.nn.Linear(2, 2)
    verify_costs_for(model, 8).observe(1, 0.1)
    remember_calibration(model, SkipCalibration(skip=[0], num_layers=2))
    record_draft_step(model, 0.1)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None
