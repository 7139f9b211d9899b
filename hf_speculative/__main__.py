"""``python -m hf_speculative`` runs the ``hf-speculative`` command line."""

from .cli import main

if __name__ == "__main__":
    main()
