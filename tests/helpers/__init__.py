"""Helpers shared by test files (never copied between them)."""
