"""Prompts as the CLI, the benchmark and the demo app give them to a model.

:func:`encode_prompt` turns a user's text into the token ids a chat model expects (its chat template,
when it has one); :data:`EXAMPLES` are the example prompts, one per task category. Speculation pays
off differently per task: prompt lookup shines where the answer copies the prompt (code editing,
summarization, question answering over a given context), much less on open chat or maths, so the
examples cover both cases. This module imports neither torch nor the app, so that the command line
and the app can share it without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["EXAMPLES", "DEFAULT_EXAMPLE", "encode_prompt"]


def encode_prompt(tokenizer: Any, text: str, chat_template: bool = True) -> "torch.Tensor":
    """Token ids `[1, L]` of ``text`` as a user turn of the chat template (raw text if there is none).

    Args:
        tokenizer: a transformers tokenizer.
        text (`str`): the user's prompt.
        chat_template (`bool`, defaults to `True`): wrap ``text`` in the tokenizer's chat template
            (with the generation prompt) when the tokenizer has one; `False` encodes the raw text.
    """
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        # The rendered template already holds the special tokens it wants (as transformers does).
        return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    return tokenizer(text, return_tensors="pt").input_ids


EXAMPLES: dict[str, str] = {
    "code editing": """\
Rename the function `mean` to `average` and the variable `values` to `numbers` in the code below. \
Reply with the complete updated code only.

```python
def mean(values):
    if not values:
        raise ValueError("mean() of an empty list")
    total = 0.0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    return mean([(value - m) ** 2 for value in values])
```
""",
    "summarization": """\
Summarize the following text in three sentences.

The city council met on Tuesday to discuss the new public library. The library will be built next to \
the central park and will have three floors: a children's floor, a floor for adults with quiet reading \
rooms, and a top floor with computers and a small café. Construction starts in March and should take \
eighteen months. The council said the library will be open every day from eight in the morning to ten \
in the evening, and that entry and borrowing books will stay free for everyone who lives in the city.""",
    "chat": "Hi! I have a free afternoon in a rainy city. Can you suggest three things to do indoors?",
    "translation": "Translate to French: The weather is nice today, so we are going to the beach with our \
friends and we will eat ice cream.",
    "maths": "A train travels 60 kilometres in 45 minutes. What is its average speed in kilometres per \
hour? Explain step by step.",
    "question answering": """\
Answer the question using only the context.

Context: Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity. \
She was the first woman to win a Nobel Prize, the first person to win a Nobel Prize twice, and the only \
person to win a Nobel Prize in two scientific fields: physics in 1903 and chemistry in 1911. She was born \
in Warsaw in 1867 and moved to Paris in 1891.

Question: In which two fields did Marie Curie win Nobel Prizes, and in which years?""",
}
"""Category name -> prompt text, in the order the page lists them."""

DEFAULT_EXAMPLE = "code editing"
"""The example `hf-speculative compare` runs without ``--prompt`` (one where prompt lookup pays off)."""
