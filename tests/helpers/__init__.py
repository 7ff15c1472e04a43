"""Test helpers shared by more than one test module (one copy each, never pasted)."""
