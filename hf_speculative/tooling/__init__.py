"""What the command line, the benchmark and the demo app share: the registry of decoding methods they
run, and prompt encoding."""
