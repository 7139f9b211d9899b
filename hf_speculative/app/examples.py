"""The demo app's example prompts: tasks the default model (``smollm2-135m-instruct``, 135M parameters) answers
sensibly, so that a visitor sees speculation on a good answer rather than on a broken one.

The command line's examples (:data:`hf_speculative.tooling.prompting.EXAMPLES`) cover more tasks (code editing,
translation, maths) for larger models; on the 135M model those came out wrong (a rename that changes the code,
a translation into nonsense French, a wrong speed), so the page offers these instead: two where the answer
copies the prompt (prompt lookup pays) and three open ones (it does not; the story is the one to sample).
"""

from __future__ import annotations

from ..tooling.prompting import EXAMPLES as _CLI_EXAMPLES

EXAMPLES: dict[str, str] = {
    "summarization": _CLI_EXAMPLES["summarization"],
    "answer from a context": """\
Answer the question using only the context.

Context: The Eiffel Tower is a wrought-iron tower in Paris, France. It was built from 1887 to 1889 as the \
entrance to the 1889 World's Fair, and it is 330 metres tall. About seven million people visit it every year.

Question: How tall is the Eiffel Tower, and when was it built?""",
    "code": "Write a Python function that reverses a string.",
    "advice": "Give me three tips for staying healthy.",
    "story (try sampling)": "Write a short story about a cat who finds a red ball.",
}
"""Label -> prompt text, in the order the page lists them."""

__all__ = ["EXAMPLES"]
