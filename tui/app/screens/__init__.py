"""Screens pushed over the main view: flowchart, help, job picker, job output."""
