"""``perfmon relay``: a node relay (``node``: this node's ranks as one stream) or, with ``--nodes``,
a group relay (``group``: the ranks of several nodes' relays reduced; docs/tree.md)."""

from __future__ import annotations

from typing import Any

from tui.errors import UserError


def main(args: Any) -> int:
    if getattr(args, "nodes", None):
        if args.tcp:
            raise UserError("a group relay (--nodes) speaks to its viewer on --stdio, not --tcp")
        from tui.commands.relay import group
        return group.main(args)
    from tui.commands.relay import node
    return node.main(args)
