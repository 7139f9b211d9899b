"""The Gemma-4 assistant's methods of the command line, the benchmark and the app: none yet.

No model of the offline registry is a Gemma-4 target with a published assistant, so there is nothing to build a
method on; use ``hfs.Assistant.from_pretrained(path, target=model)`` directly (docs/drafters/assistant.md).
"""

METHODS: list[dict] = []
