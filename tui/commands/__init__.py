"""One module per ``perfmon`` subcommand, each with ``main(args) -> int`` (dispatched by ``tui.cli``).

``attach``, ``ls``, ``run``, ``record``, ``report`` and the ``demo`` package; they wire
the stream readers to the model and, for ``attach``, to the Textual app.
"""
