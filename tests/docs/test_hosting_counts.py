"""docs/hosting.md counts the hostile-folder battery's cases from the battery itself: the sentence must follow the
test when cases are added (it once said 60 while the battery held 107)."""

from __future__ import annotations

import collections
import re

from docblocks import DOCS

from tests.security.test_hostile_folder import CASES, HAS_GEMMA4

PAGE = DOCS / "hosting.md"
GROUP_WORDS = {"linked out": "files linked out of the folder", "outside the folder": "paths outside the folder",
               "runaway read": "runaway reads", "raw error": "malformed values", "amplification": "amplifications",
               "API": "misuses of the Python API"}


def test_the_page_counts_the_batterys_cases_and_groups():
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assistant = sum(1 for case in CASES if case.name.startswith("Assistant.from_pretrained"))
    if not HAS_GEMMA4:  # transformers 4.x: the battery leaves the assistant's cases out; the page says how many
        assert assistant == 0 and f"; {len(CASES)} on a transformers without Gemma 4" in text
        return
    assert (f"It holds {len(CASES)} cases (its `CASES` list; {len(CASES) - assistant} on a transformers without "
            f"Gemma 4, which leaves out the {assistant} cases of its assistant)") in text
    assert f"`hostile-folder battery: {len(CASES)} tried, {len(CASES)} refused, ...`" in text
    groups = collections.Counter(case.group for case in CASES)
    assert set(groups) == set(GROUP_WORDS), "name a new group of the battery in the page (and here)"
    for group, count in groups.items():
        assert re.search(rf"\b{count} {re.escape(GROUP_WORDS[group])}", text), (group, count)
