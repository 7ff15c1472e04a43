"""Errors that reach the user as one line."""


class UserError(Exception):
    """A mistake the user can fix (no job, bad file, version mismatch): one line, exit 2."""
