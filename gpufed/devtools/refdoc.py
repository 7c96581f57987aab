"""`python -m gpufed.devtools.refdoc [PATH]`: the CLI reference, generated from the typer app.

Owns: walking the `gpufed` command tree (`typer.main.get_command(gpufed.cli.app)`, sub-groups
recursively), describing each command's usage, help, arguments and options (`commands`), and
rendering them as Markdown (`render`); `main` writes it to docs/reference/cli.md (or PATH). A unit
test (tests/unit/gpufed/devtools/test_refdoc.py) fails when the committed file differs from `render()`.

Invariants: the output depends only on the code — no terminal width, no colour, no rich markup
rendering (help texts are printed as written), commands sorted by their full name. Hidden commands
and options, and every command's `--help`, are left out.

Does not: define commands or flags (see the verb modules of `gpufed.cli`), or document the CRDs
(`gpufed.devtools.crdref`) or the metrics (`gpufed.devtools.metricsdoc`).
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from pathlib import Path

import typer.main

# typer vendors its own copy of click: `typer.main.get_command` returns a `typer._click.Command`
# (a TyperGroup for the app), not a `click.Group`, so the tree is walked with typer's classes.
from typer._click import Command, Context, Parameter
from typer.core import TyperArgument, TyperGroup, TyperOption

from gpufed.devtools.gendoc import write_page

DEFAULT_PATH = Path("docs/reference/cli.md")
REGENERATE = ".venv/bin/python -m gpufed.devtools.refdoc"


@dataclass(frozen=True)
class ParamDoc:
    #: Option names (`-o`, `--output`; with `--x/--no-x` both) or the argument's metavar.
    names: tuple[str, ...]
    type: str
    default: str
    envvar: str
    help: str
    required: bool
    repeatable: bool


@dataclass(frozen=True)
class CommandDoc:
    #: The full command line prefix, e.g. `gpufed network connect`.
    path: str
    usage: str
    help: str
    arguments: tuple[ParamDoc, ...]
    options: tuple[ParamDoc, ...]
    subcommands: tuple[str, ...]


def _clean(text: str | None) -> str:
    """A docstring or help text as written: dedented, click's `\\b` no-rewrap markers dropped."""
    lines = inspect.cleandoc(text or "").splitlines()
    return "\n".join(line for line in lines if line.strip() != "\b").strip()


def _type_name(param: TyperOption | TyperArgument, ctx: Context) -> str:
    if isinstance(param, TyperOption) and param.count:
        return "count"
    if isinstance(param, TyperOption) and param.is_flag:
        return "flag"
    # typer's own label as `--help` shows it (`<int>`, `<path>`, `<a|b>`), without the brackets.
    return param.display_type(ctx).removeprefix("<").removesuffix(">")


def _default(param: TyperOption | TyperArgument) -> str:
    if param.required:
        return ""
    value = param.default
    if callable(value) or value is None:
        return ""
    if isinstance(param, TyperOption) and param.is_flag and param.secondary_opts:
        # `--wait/--no-wait`: name the flag that is in effect by default.
        return param.opts[0] if value else param.secondary_opts[0]
    if isinstance(param, TyperOption) and param.is_flag:
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) if value else ""
    return str(value)


def _envvar(param: Parameter) -> str:
    env = param.envvar
    if env is None:
        return ""
    return env if isinstance(env, str) else ", ".join(env)


def _param(param: TyperOption | TyperArgument, ctx: Context) -> ParamDoc:
    if isinstance(param, TyperOption):
        names = tuple(param.opts) + tuple(param.secondary_opts)
    else:
        names = ((param.metavar or param.name).upper(),)
    return ParamDoc(
        names=names,
        type=_type_name(param, ctx),
        default=_default(param),
        envvar=_envvar(param),
        help=_clean(param.help),
        required=param.required,
        repeatable=param.multiple or param.nargs == -1,
    )


def _usage(cmd: Command, ctx: Context, arguments: list[TyperArgument]) -> str:
    """`gpufed x [OPTIONS] NAME`, spelled as click spells usage lines (typer's own uses `{name}`)."""
    pieces = [ctx.command_path]
    if cmd.options_metavar:
        pieces.append(cmd.options_metavar)
    for a in arguments:
        name = (a.metavar or a.name).upper() + ("..." if a.nargs == -1 else "")
        pieces.append(name if a.required else f"[{name}]")
    if isinstance(cmd, TyperGroup):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _walk(cmd: Command, ctx: Context, out: list[CommandDoc]) -> None:
    subs: list[tuple[str, Command]] = []
    if isinstance(cmd, TyperGroup):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                subs.append((name, sub))
    params = [p for p in cmd.get_params(ctx) if p.name != "help" and not getattr(p, "hidden", False)]
    arguments = [p for p in params if isinstance(p, TyperArgument)]
    out.append(
        CommandDoc(
            path=ctx.command_path,
            usage=_usage(cmd, ctx, arguments),
            help=_clean(cmd.help),
            arguments=tuple(_param(p, ctx) for p in arguments),
            options=tuple(_param(p, ctx) for p in params if isinstance(p, TyperOption)),
            subcommands=tuple(name for name, _ in subs),
        )
    )
    for name, sub in subs:
        _walk(sub, sub.context_class(sub, info_name=name, parent=ctx), out)


def commands() -> list[CommandDoc]:
    """Every visible `gpufed` command and group, depth first, sub-commands sorted by name."""
    from gpufed.cli import app

    root = typer.main.get_command(app)
    out: list[CommandDoc] = []
    _walk(root, root.context_class(root, info_name="gpufed"), out)
    return out


def _md(text: str) -> str:
    """Help text as Markdown shows it literally: `<ns>` is not an HTML tag, `*` no emphasis.
    Code spans (between backticks) are left as they are."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts)


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped."""
    return _md(" ".join(text.split())).replace("|", "\\|")


def _anchor(path: str) -> str:
    """GitHub's heading anchor for `## \\`gpufed x y\\``: lower case, spaces to dashes."""
    return path.lower().replace(" ", "-")


def _first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n", 1)[0].split())


def _options_table(options: tuple[ParamDoc, ...]) -> list[str]:
    lines = ["| option | type | default | env | description |", "|---|---|---|---|---|"]
    for o in options:
        names = ", ".join(f"`{n}`" for n in o.names)
        notes = [s for s, on in (("required", o.required), ("repeatable", o.repeatable)) if on]
        if notes:
            names += f" ({', '.join(notes)})"
        default = f"`{o.default}`" if o.default else "—"
        env = f"`{o.envvar}`" if o.envvar else "—"
        lines.append(f"| {names} | {_cell(o.type)} | {_cell(default)} | {env} | {_cell(o.help)} |")
    return lines


def _arguments_table(arguments: tuple[ParamDoc, ...]) -> list[str]:
    lines = ["| argument | type | required | description |", "|---|---|---|---|"]
    for a in arguments:
        name = f"`{a.names[0]}`" + (" (repeatable)" if a.repeatable else "")
        lines.append(f"| {name} | {_cell(a.type)} | {'yes' if a.required else 'no'} | {_cell(a.help)} |")
    return lines


def render() -> str:
    docs = commands()
    lines = [
        "# CLI reference",
        "",
        f"<!-- Generated by `{REGENERATE}` from the typer app (gpufed.cli): do not edit."
        " A unit test (tests/unit/gpufed/devtools/test_refdoc.py) fails when this file and the code disagree. -->",
        "",
        "Every command also takes `--help`. Options that name an `env` variable read it when the"
        " option is not given. Options marked `flag` take no value.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for c in docs[1:]:
        lines.append(f"| [`{c.path}`](#{_anchor(c.path)}) | {_cell(_first_paragraph(c.help))} |")
    for c in docs:
        lines += ["", f"## `{c.path}`", "", "```", c.usage, "```"]
        if c.help:
            lines += ["", _md(c.help)]
        if c.subcommands:
            lines += ["", "Commands: " + ", ".join(f"[`{s}`](#{_anchor(f'{c.path} {s}')})" for s in c.subcommands)]
        if c.arguments:
            lines += ["", *_arguments_table(c.arguments)]
        if c.options:
            lines += ["", *_options_table(c.options)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    write_page(argv, DEFAULT_PATH, render, f"{len(commands())} commands")


if __name__ == "__main__":
    main()
