"""Training the drafters that learn from the target: EAGLE heads and exit adapters (the [train] extra).

``hf-speculative self-distill`` writes the target's own answers to prompts, ``train-eagle`` trains a
drafter on them (on CPU, one GPU or several through ``accelerate launch``), ``export-eagle`` ships it.
Nothing here is imported by ``import hf_speculative``; the modules load accelerate and tqdm on use.
"""
