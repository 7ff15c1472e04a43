"""One module per pane of the TUI, plus the shared drawing, units and layout helpers."""
