"""Shared fixtures. Engine fixtures live in tests/engines/."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


@pytest.fixture
def probe_recording_path() -> Path:
    """Real H200 readings (shared/data probe) converted to a recording."""
    return FIXTURES / "h200-probe.jsonl"
