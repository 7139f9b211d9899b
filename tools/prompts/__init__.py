"""The prompt lists the shipped drafters were self-distilled from (see ``benchmarks/training-history.md``).

- :mod:`tools.prompts.builtin`: templates crossed with ~100 hand-picked topics, maths with random
  numbers, Python's documentation as contexts, German manual pages to translate;
- :mod:`tools.prompts.context`: long-context summaries, RAG and extraction over given passages;
- :mod:`tools.prompts.wordnet`: topic-diverse prompts from Debian's WordNet and fortune files.

``python -m tools.prompts KIND N|A-B --out FILE`` writes one of them as the JSONL file that
``hf-speculative self-distill --prompts FILE`` reads. For your own drafter, your own conversations, a
prompts file or the target's own prompts (``hf-speculative sample-prompts``) are the better data.
"""
