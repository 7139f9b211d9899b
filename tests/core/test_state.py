"""Per-model state (``hf_speculative.core.state``): one object per model, filled by the modules that
measure and check, and one ``forget(model)`` that drops all of it for that model and no other."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
import weakref

import torch

import hf_speculative as hfs
from hf_speculative.core.costs import draft_price, record_draft_step, verify_costs_for
from hf_speculative.drafters.self_speculative.calibration import SkipCalibration, cached_calibration, remember_calibration
from hf_speculative.drafters.self_speculative.layer_view import TargetLayers, check_structure, layer_subset
from hf_speculative.core.state import ModelState, forget, state_of
from hf_speculative.drafters.suffix.history import history_for
from hf_speculative.hf import loop_hooks as hooks
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
    history = history_for(target, 8, 100, None)  # SuffixDecoding's history of its outputs
    history.add([1, 2, 3])
    return {"costs": costs, "view": view, "plan": plan, "checked": [draft, eagle, adapter], "history": history}


def assert_remembered(target: torch.nn.Module, held: dict) -> None:
    state = state_of(target)
    assert verify_costs_for(target, 8) is held["costs"] and held["costs"].seconds(2) == 0.5
    assert layer_subset(target, [0]) is held["view"]
    assert state.drafter_state(TargetLayers).structure_problem == ""  # probed, and fine
    assert cached_calibration(target) is held["plan"]
    assert all(net in state.checked for net in held["checked"])
    assert state.draft_step_s == 0.25
    assert history_for(target, 8, 100, None) is held["history"] and held["history"].tokens == 3


def test_forget_drops_every_cache_of_that_model_and_no_other():
    first, second = build_model("llama"), build_model("llama", seed=5)
    held_first, held_second = remember_everything(first), remember_everything(second)
    assert_remembered(first, held_first)
    forget(first)

    empty = ModelState()
    state = state_of(first)
    assert (state.verify_costs, state.drafters, state.draft_step_s) == (empty.verify_costs, empty.drafters,
                                                                        empty.draft_step_s)
    assert len(state.checked) == 0
    assert cached_calibration(first) is None
    fresh = verify_costs_for(first, 8)
    assert fresh is not held_first["costs"] and fresh.seconds(2) is None
    assert layer_subset(first, [0]) is not held_first["view"]
    assert draft_price(first, fresh, None, prior=0.7) == 0.7  # its measured drafting step is gone too
    history = history_for(first, 8, 100, None)
    assert history is not held_first["history"] and history.tokens == 0  # its SuffixDecoding history too
    assert_remembered(second, held_second)  # untouched


def test_drafters_keep_their_state_in_the_one_slot_by_types_of_their_own_folders():
    target = build_model("llama")
    remember_everything(target)
    kinds = set(state_of(target).drafters)
    assert {k.__name__ for k in kinds} >= {"TargetLayers", "HeldCalibration", "ModelHistories"}
    assert all(k.__module__.startswith("hf_speculative.drafters.") for k in kinds)


def test_a_drafter_state_is_made_once_per_model_and_kind_and_forget_drops_it():
    made = []

    class Mine:  # what a drafter's folder defines
        def __init__(self):
            made.append(self)

    class Other:
        pass

    model = torch.nn.Linear(2, 2)
    seen, start = [], threading.Barrier(8)

    def get():
        start.wait()
        seen.append(state_of(model).drafter_state(Mine))

    threads = [threading.Thread(target=get) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and all(mine is made[0] for mine in seen)
    assert isinstance(state_of(model).drafter_state(Other), Other)
    assert state_of(torch.nn.Linear(2, 2)).drafter_state(Mine) is not made[0]  # another model's own
    forget(model)
    assert state_of(model).drafters == {} and state_of(model).drafter_state(Mine) is not made[0]
    assert len(made) == 3


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


# Every slot of ModelState: what forget() does with it. A new slot fails here until it is listed.
CARRIED = {"hook_users"}  # counts calls running now: they keep what they hold, the last one takes the hooks away
DROPPED = {f.name for f in dataclasses.fields(ModelState)} - CARRIED


def test_forget_empties_every_slot_and_carries_only_the_count_of_running_calls():
    assert DROPPED == {"verify_costs", "padded_costs", "batch_costs", "draft_step_s", "catch_up_token_s", "accept_rate",
                       "checked", "last_stats", "static_cache", "compiled", "compile_mode", "static_budget", "drafters",
                       "lock", "forward_turn"}
    model = torch.nn.Linear(2, 2)
    old = state_of(model)
    sentinels = {name: object() for name in DROPPED | CARRIED}
    for name, value in sentinels.items():
        setattr(old, name, value)
    forget(model)
    new, empty = state_of(model), ModelState()
    assert new is not old
    for name in DROPPED:
        value, default = getattr(new, name), getattr(empty, name)
        assert value is not sentinels[name], name
        assert type(value) is type(default), name
        if not isinstance(default, (weakref.WeakSet, threading.local)) and "lock" not in type(default).__name__.lower():
            assert value == default, name
    assert len(new.checked) == 0 and not hasattr(new.last_stats, "stats")
    assert new.hook_users is sentinels["hook_users"]


def loop_hooks(model: torch.nn.Module) -> set[str]:
    return set(hooks.LOOP_HOOKS) & set(model.__dict__)


def test_loop_hooks_are_counted_in_the_model_state_and_outlive_forget_while_a_call_holds_them():
    model = build_model("llama")  # not enabled: a custom_generate call lends it the hooks
    with contextlib.ExitStack() as first:
        first.enter_context(hooks.temporary_loop_hooks(model))
        assert loop_hooks(model) == set(hooks.LOOP_HOOKS) and state_of(model).hook_users.count == 1
        forget(model)  # while the first call runs
        with hooks.temporary_loop_hooks(model):
            assert state_of(model).hook_users.count == 2
            first.close()  # the first call ends while the second still uses the hooks
            assert loop_hooks(model) == set(hooks.LOOP_HOOKS)
        assert state_of(model).hook_users.count == 0
    assert not loop_hooks(model)
    assert not [name for name in model.__dict__ if name.startswith("_hf_speculative")]
    enabled = hfs.enable(build_model("llama"))
    with hooks.temporary_loop_hooks(enabled):
        pass
    assert loop_hooks(enabled) == set(hooks.LOOP_HOOKS)  # an enabled model keeps its own

