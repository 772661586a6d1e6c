"""Helpers that start real inference engines for the tests (no downloads, 127.0.0.1 only)."""
