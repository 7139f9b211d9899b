"""The transformers adapter: enable(), the generate() entry, the JSON spec of a strategy."""
