"""Shared test helpers (no tests here). Import as ``from helpers.X import ...``;
``tests/`` is on ``sys.path`` because ``tests/conftest.py`` lives there."""
