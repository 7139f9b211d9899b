"""The neutral prompt module shared by the CLI, the benchmark and the app."""

import subprocess
import sys

from hf_speculative.tooling.prompting import DEFAULT_EXAMPLE, EXAMPLES, encode_prompt


def test_encode_prompt_with_and_without_chat_template(chat_tokenizer):
    tokenizer = chat_tokenizer
    ids = encode_prompt(tokenizer, "the cat")
    assert tokenizer.convert_ids_to_tokens(ids[0].tolist()) == ["<|user|>", "the", "cat", "<|assistant|>"]
    assert encode_prompt(tokenizer, "the cat", chat_template=False)[0].tolist() == tokenizer("the cat").input_ids
    tokenizer.chat_template = None
    assert encode_prompt(tokenizer, "the cat").shape == (1, len(tokenizer("the cat").input_ids))


def test_examples_cover_the_task_categories():
    assert DEFAULT_EXAMPLE in EXAMPLES and "def mean(values)" in EXAMPLES[DEFAULT_EXAMPLE]
    assert {"code editing", "summarization", "chat", "translation", "maths", "question answering"} <= set(EXAMPLES)
    assert all(text.strip() for text in EXAMPLES.values())


def test_the_app_shows_examples_of_its_own_that_share_the_cli_texts():
    # the app offers the tasks its default 135M model answers sensibly (hf_speculative/app/examples.py); a task
    # both offer has one text
    from hf_speculative.app.examples import EXAMPLES as app_examples

    assert app_examples and all(text.strip() for text in app_examples.values())
    assert all(app_examples[name] == EXAMPLES[name] for name in set(app_examples) & set(EXAMPLES))


def test_prompting_imports_neither_the_app_nor_the_cli():
    code = ("import sys, hf_speculative.tooling.prompting; "
            "print(sorted(m for m in sys.modules if m.startswith(('hf_speculative.app', 'hf_speculative.cli.main', "
            "'hf_speculative.bench', 'gradio', 'typer'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
