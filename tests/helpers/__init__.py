"""Helpers the tests share; the fixtures they share are in tests/conftest.py."""
