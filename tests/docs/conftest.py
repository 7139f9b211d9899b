"""What every docs test shares: a page may declare a drafter of its own (docs/api/extending.md declares
``method="repeat-last"``), and declaring registers it; the drafter registry is left as each test found it, so that
such a method does not reach later tests of the same process (the identity matrix covers every registered method)."""

from __future__ import annotations

import pytest

from hf_speculative.drafters import registry


@pytest.fixture(autouse=True)
def _registry_as_found(monkeypatch):
    registry.registered()  # the package's own drafters, discovered before the copy
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
