"""The Textual app: ``perfmon_app`` (the main view and its CSS beside it), ``widgets`` (one
module per pane) and ``screens`` (flowchart, help, picker, log). It draws views that the
model computed; it never reads a socket itself.
"""
