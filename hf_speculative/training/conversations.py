"""Chat conversations as training data: the JSONL formats EAGLE's and SpecForge's datasets come in.

Two row layouts are read (one conversation per line):

- ``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...]}``
  (OpenAI / Hugging Face chat format; roles ``system``, ``user``, ``assistant``);
- ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``
  (ShareGPT; ``human``/``user``, ``gpt``/``assistant``/``chatgpt``/``bard``/``bing``, ``system``).

A conversation is rendered with the target's chat template, so the drafter trains on exactly the token
layout it drafts on, and only the assistant turns are learnt (their content and the template's end of
turn after it); the user turns give the context. The target's features and distribution over the
human-written answers are what the drafter learns from (teacher forcing on someone else's text, as
EAGLE-1 trained on ShareGPT); ``hf-speculative self-distill --prompts FILE`` instead has the target
answer each conversation's first user turn itself, which matches its distribution best.
"""

from __future__ import annotations

from typing import Any

ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
         "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant"}


def conversation(row: dict, where: str = "row") -> list[dict] | None:
    """The row's turns as ``[{"role", "content"}]`` with roles ``system`` / ``user`` / ``assistant``, or
    ``None`` when the row is not a conversation. ``where`` names the row in errors (e.g. ``"file.jsonl:3"``)."""
    if "messages" in row:
        turns, role_key, text_key = row["messages"], "role", "content"
    elif "conversations" in row:
        turns, role_key, text_key = row["conversations"], "from", "value"
    else:
        return None
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise ValueError(f"{where}: a conversation is a list of turns, each an object with {role_key!r} and "
                         f"{text_key!r}.")
    out = []
    for i, turn in enumerate(turns):
        role, text = turn.get(role_key), turn.get(text_key)
        if role not in ROLES or not isinstance(text, str):
            raise ValueError(f"{where}: turn {i} has {role_key}={role!r} and a {type(text).__name__} {text_key!r}; "
                             f"expected one of {sorted(ROLES)} and a string.")
        out.append({"role": ROLES[role], "content": text})
    return out


def first_user_turn(turns: list[dict]) -> str | None:
    """What the user said first (the prompt a self-distillation answers), or ``None``."""
    return next((t["content"] for t in turns if t["role"] == "user"), None)


def _render(tokenizer: Any, turns: list[dict], prompt: bool) -> str:
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=prompt)


def chat_tokens(tokenizer: Any, turns: list[dict], where: str = "row") -> tuple[list[int], list[int]]:
    """``(ids, learnt)``: the conversation under the target's chat template, and per token ``1`` where it
    belongs to an assistant turn (its content and the template's end of turn, not the whitespace after
    it), else ``0``. Trailing user turns are dropped (nothing after them is learnt), and so are leading
    assistant turns (no prompt precedes them, and drafting always follows one); a conversation left with
    no assistant turn gives ``([], [])``, which `read_examples` skips like any too-short example.

    Raises `ValueError` when the tokenizer has no chat template or no offsets (a slow tokenizer), or when
    the template rewrites earlier turns as the conversation grows (assistant turns cannot be located)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{where}: the target's tokenizer has no chat template, so conversations cannot be laid out "
                         "as it would see them; give the text as {'text': ...} rows instead.")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{where}: conversations need a fast tokenizer (character offsets) to find the assistant "
                         "turns.")
    while turns and turns[-1]["role"] != "assistant":
        turns = turns[:-1]
    while turns and turns[0]["role"] == "assistant":
        turns = turns[1:]
    if not any(turn["role"] == "assistant" for turn in turns):
        return [], []
    text = _render(tokenizer, turns, prompt=False)
    spans = []
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        before, through = _render(tokenizer, turns[:i], prompt=True), _render(tokenizer, turns[: i + 1], prompt=False)
        if not (text.startswith(before) and text.startswith(through) and len(before) <= len(through)):
            raise ValueError(f"{where}: the target's chat template lays out earlier turns differently once later ones "
                             "follow, so the assistant turns cannot be located; self-distill the first user turns "
                             "instead (hf-speculative self-distill --prompts FILE).")
        end = len(through)
        while end > len(before) and text[end - 1].isspace():  # the newline after an end of turn is never drafted
            end -= 1
        spans.append((len(before), end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    learnt = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), learnt
