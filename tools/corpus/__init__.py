"""A self-distillation corpus at scale, in one command: ``python -m tools.corpus build --target MODEL --out DIR``.

The target's own greedy answers (``hf-speculative self-distill``'s function) to a deduplicated mix of prompts from
the team's builders (:mod:`tools.prompts.wordnet`, :mod:`tools.prompts.builtin`) and the target's own messages
(``hf-speculative sample-prompts``' function, Magpie), never Spec-Bench's questions, with a held-out split by the
hash of each prompt's text. Every stage resumes, and a corpus grows without redoing what it has. It is data, kept
outside the repository (the command refuses an ``--out`` inside it); ``DIR/MANIFEST.json`` and ``DIR/README.md``
say what it holds and the command that makes it again.

- :mod:`tools.corpus.mix`: the mix's order, normalised text, the Spec-Bench filter, the held-out hash;
- :mod:`tools.corpus.sources`: the candidate streams;
- :mod:`tools.corpus.prompts`: stage 1, the prompt list; :mod:`tools.corpus.answers`: stage 2, the answers;
- :mod:`tools.corpus.manifest`: ``MANIFEST.json`` and ``README.md``; :mod:`tools.corpus.files`: the folder's files;
- :mod:`tools.corpus.lists`: the WordNet and built-in candidates written to files, for a build elsewhere (a GPU);
- :mod:`tools.corpus.build`: :func:`~tools.corpus.build.build` and :func:`~tools.corpus.build.status`.
"""
