"""Where records come from: finding live jobs, tokens, reading sockets, TCP and recordings.

``discovery`` scans the socket directory and resolves a TARGET; ``sources`` decodes
frames from a live socket or a recording into validated wire records; ``feed`` is the
asyncio reader the TUI runs (live, TCP, replay). No Textual here.
"""
