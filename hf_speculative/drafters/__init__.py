"""One module per drafter."""
