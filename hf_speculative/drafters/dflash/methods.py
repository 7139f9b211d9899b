"""DFlash has no method of the command line, the benchmark or the app yet: no registry model has a DFlash drafter
that ships (issue 47 trains one); load one with ``hfs.DFlash.from_pretrained(path, target=model)``."""

METHODS = []
