"""Example prompts of the demo app, one per task category.

Speculation pays off differently per task: prompt lookup shines where the answer copies the prompt
(code editing, summarization, question answering over a given context), much less on open chat or
maths. The examples cover those categories so that a visitor sees both cases.
"""

from __future__ import annotations

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
