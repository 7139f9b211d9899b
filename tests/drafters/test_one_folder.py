"""A drafter is one folder: written here, at test time, outside the package (a plugin directory added to
``hf_speculative.drafters.__path__``), with no other file edited, it is found by everything that reads drafters: the
spec reader (a model saved with it as its default, loaded back), the command line's ``methods``, the app's list of
methods and its option slots, the identity matrix (``registry.examples`` / ``tests/conftest.make_drafter``) and the
public names (``hfs.RepeatToy``). Issue 68: "adding a drafter touches its folder, its docs page and the docs index
only"."""

from __future__ import annotations

import json
import sys

import pytest
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

import hf_speculative as hfs
import hf_speculative.drafters as drafters_package
from hf_speculative.drafters import registry
from hf_speculative.hf import spec
from tests.conftest import build_model, make_drafter, prompt_inputs, stock_generate

FOLDER = "toy_repeat"  # hf_speculative.drafters.toy_repeat, from the plugin directory
FILES = {
    "__init__.py": '''
"""A toy drafter kept outside the package: it guesses that the last token comes again."""

from ..registry import lazy_attribute

PUBLIC = {"RepeatToy": "drafter"}


def __getattr__(name):
    return lazy_attribute(__name__, PUBLIC, name)
''',
    "drafter.py": '''
import dataclasses

from ...core.tree import DraftTree
from ..generator import SpeculativeCandidateGenerator
from ..registry import Capabilities, example_label
from ..strategy import DraftStrategy


@dataclasses.dataclass
class RepeatToy(DraftStrategy, method="repeat-toy", capabilities=Capabilities(batch=True),
                examples=("repeat-toy", "repeat-toy-fixed")):
    num_tokens: int = 3

    def open(self, ctx):
        return RepeatToyDrafter(ctx, self)

    @classmethod
    def example(cls, target, label=None, **options):
        settings = {"repeat-toy": {}, "repeat-toy-fixed": {"num_tokens": 5}}[example_label(cls, label)]
        return cls(**{**settings, **options})


class RepeatToyDrafter(SpeculativeCandidateGenerator):
    def __init__(self, ctx, config):
        super().__init__(ctx)
        self.num_tokens = config.num_tokens

    def draft(self, sequence, plan):
        return DraftTree.chain(sequence[0, -1:].repeat(min(self.num_tokens, plan.depth)))
''',
    "methods.py": '''
METHODS = [
    {"name": "repeat-toy", "order": 900, "label": "Repeat (toy)", "description": "The last token, again.",
     "options": {"num_tokens": None}, "build": "build_repeat_toy"},
]


def build_repeat_toy(model, tokenizer, call):
    from .drafter import RepeatToy

    return {"candidate_generator": RepeatToy(**call.given("num_tokens"))}
''',
}


@pytest.fixture
def toy_folder(tmp_path, monkeypatch):
    """The toy drafter's folder in a plugin directory on the drafters' package path; afterwards the path, the
    registry and the modules are as they were."""
    plugins = tmp_path / "plugins"
    for name, text in FILES.items():
        (plugins / FOLDER / name).parent.mkdir(parents=True, exist_ok=True)
        (plugins / FOLDER / name).write_text(text.lstrip(), encoding="utf-8")
    registry.registered()  # the package's own drafters, discovered before the copy of the registry
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    monkeypatch.setattr(drafters_package, "__path__", [*drafters_package.__path__, str(plugins)])
    registry.rescan()
    yield plugins / FOLDER
    monkeypatch.undo()
    for name in [m for m in sys.modules if m.startswith(f"{drafters_package.__name__}.{FOLDER}")]:
        del sys.modules[name]
    vars(hfs).pop("RepeatToy", None)  # the package's lazy name, kept on first access
    registry.rescan()


def test_the_folder_is_found_by_the_registry_and_the_public_names(toy_folder):
    assert f"hf_speculative.drafters.{FOLDER}" in registry.folders()
    cls = registry.strategy_class("repeat-toy")  # imported by the registry: nothing imported it before
    assert cls.declaration.method == "repeat-toy" and cls.declaration.capabilities.batch
    assert hfs.RepeatToy is cls and "RepeatToy" in hfs.__dir__()


def test_a_model_saved_with_it_loads_it_back_from_the_spec(toy_folder, tmp_path):
    model = hfs.enable(build_model("llama"))
    plain = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=24)
    model.generation_config.candidate_generator = registry.strategy_class("repeat-toy")(num_tokens=2)
    model.save_pretrained(tmp_path / "model")
    written = json.loads((tmp_path / "model" / "generation_config.json").read_text())["candidate_generator"]
    assert written == {"method": "repeat-toy", "options": {"num_tokens": 2}}
    loaded = hfs.enable(AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval())
    out = loaded.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24)
    assert out.tolist() == plain.tolist()
    restored = loaded.generation_config.candidate_generator
    assert spec.method_of(restored) == "repeat-toy" and restored.num_tokens == 2
    assert hfs.last_stats(loaded).method == "repeat-toy"


def test_the_command_line_and_the_app_list_its_method(toy_folder):
    from hf_speculative.app.request import option_slots, selectable_methods
    from hf_speculative.cli.main import app

    result = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert any(line.split()[:1] == ["repeat-toy"] and "The last token, again." in line
               for line in result.stdout.splitlines())
    assert "repeat-toy" in selectable_methods()
    assert [slot.key for slot in option_slots() if slot.method == "repeat-toy"] == ["num_tokens"]


@pytest.mark.parametrize("label", ["repeat-toy", "repeat-toy-fixed"])
def test_the_identity_matrix_builds_its_examples(toy_folder, label):
    assert registry.examples()[label] is registry.strategy_class("repeat-toy")
    model = hfs.enable(build_model("llama"))
    plain = stock_generate(model, **prompt_inputs(), do_sample=False, max_new_tokens=24)
    drafter = make_drafter(label, model, plain)
    out = model.generate(**prompt_inputs(), do_sample=False, max_new_tokens=24, candidate_generator=drafter)
    assert out.tolist() == plain.tolist()
    assert hfs.last_stats(model).drafted_tokens > 0


def test_gone_with_its_folder(toy_folder, monkeypatch):
    """Negative control: the finds above are the folder's. Found while its directory is on the path, and gone from
    the folders, the tools' methods and the app's list once it is not (a class already imported stays registered)."""
    from hf_speculative.app.request import selectable_methods
    from hf_speculative.tooling.methods import available_methods

    assert "repeat-toy" in available_methods() and "repeat-toy" in selectable_methods()
    monkeypatch.setattr(drafters_package, "__path__", [p for p in drafters_package.__path__ if "plugins" not in p])
    registry.rescan()
    assert f"hf_speculative.drafters.{FOLDER}" not in registry.folders() and "RepeatToy" not in registry.public_names()
    assert "repeat-toy" not in available_methods() and "repeat-toy" not in selectable_methods()
