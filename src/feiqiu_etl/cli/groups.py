"""``SuggestingGroup``: a click group whose "No such command" names the close ones, as click does for options
(``No such option '--sit-id'. (Did you mean one of: '--set', '--site-id'?)``) and as git does for commands.

Click (8.4+) suggests only among the commands it has loaded, and the top-level group loads its commands lazily
(:data:`feiqiu_etl.cli.app.COMMANDS`), so ``feiqiu-etl rnu`` got no suggestion; this group suggests among all."""

from __future__ import annotations

import difflib

import click


class SuggestingGroup(click.Group):
    """A :class:`click.Group` whose unknown command's one-line error (exit 2) ends ``Did you mean 'run'?``, or
    ``(Did you mean one of: 'run', 'runs'?)``: the commands within difflib's default 0.6 similarity, at most three."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = args[0] if args else ""
            if not name or name.startswith("-") or "Did you mean" in exc.format_message() \
                    or self.get_command(ctx, name) is not None:
                raise
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3)
            if not close:
                raise
            hint = f"Did you mean {close[0]!r}?" if len(close) == 1 else \
                f"(Did you mean one of: {', '.join(repr(c) for c in close)}?)"
            raise click.UsageError(f"No such command {name!r}. {hint}", ctx) from None
