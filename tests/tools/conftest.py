"""The tests of the team's tools (``tools/`` at the repository's root, not installed with the package).

``tools`` is imported from the checkout: the repository's root goes first on ``sys.path``, as it is for
``python -m tools.prompts`` run from there.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
