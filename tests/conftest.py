import pytest


@pytest.fixture
def qdir(tmp_path):
    """A fresh queue directory path (not yet created)."""
    return str(tmp_path / "q")
