"""The reference pages' tables, printed from the code so they cannot drift from it: the
configuration from the settings classes and the topology file's model, the command line from
its typer app, the error codes from their registry (`core.error_codes`), the metrics from their
definitions (`core.telemetry`), the Python API from the signatures and docstrings of what
`bandgate` exports.

`python -m tools.docs_reference` rewrites the blocks between `<!-- reference:NAME -->` and
`<!-- /reference:NAME -->` in docs/reference/*.md (the prose around them is written by hand);
`--check` only says which differ. `tests/unit/test_docs_reference.py` fails when a page differs
from what this prints, and when a setting, key, command, option, code, metric or Python name
has no words.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def _cell(text: str) -> str:
    """One table cell: no line breaks, no `|` that would split it, and no `<name>` outside
    backticks that Markdown would take for an HTML tag."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    parts[::2] = [part.replace("<", "&lt;").replace(">", "&gt;") for part in parts[::2]]
    return "`".join(parts)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    variable: str
    default: str
    description: str


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return f"`{json.dumps(list(value))}`"
    return f"`{value}`"


def settings_of(cls: type[BaseSettings]) -> list[Setting]:
    """The settings `cls` declares itself (inherited ones are listed with their own class)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    own = cls.__dict__.get("__annotations__", {})
    return [
        Setting(f"{prefix}{name}".upper(), _default(field.default), field.description or "")
        for name, field in cls.model_fields.items()
        if name in own
    ]


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    from bandgate.consumers.settings import WorkerSettings
    from bandgate.core.producer import ProducerSettings
    from bandgate.gateway.settings import GatewaySettings
    from bandgate.pull.settings import PullSettings
    from bandgate.topology.settings import BrokerSettings

    return [
        ("Every process: the broker and the topology", BrokerSettings),
        ("The gateway (`bandgate gateway`, `bandgate dev`)", GatewaySettings),
        ("HTTP receivers (served by the gateway)", PullSettings),
        ("Workers (`bandgate worker`)", WorkerSettings),
        ("The Python producer (`Producer`, `SyncProducer`)", ProducerSettings),
    ]


def configuration_section() -> str:
    parts = []
    for title, cls in settings_classes():
        rows = [(f"`{s.variable}`", s.default, s.description) for s in settings_of(cls)]
        parts.append(f"### {title}\n\n`{cls.__module__}.{cls.__name__}`:\n")
        parts.append(_table(("variable", "default", "meaning"), rows) + "\n")
    return "\n".join(parts).rstrip("\n")


# --- the topology file ---------------------------------------------------------------------

TOML_TYPES = {str: "string", int: "integer", float: "float", bool: "boolean", Path: "string"}


def _toml_type(annotation: Any) -> str:
    """How a field's type reads in TOML terms."""
    from pydantic import BaseModel

    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{json.dumps(value)}`" for value in args)
    if origin in (UnionType, Union):
        kinds = [_toml_type(arg) for arg in args if arg is not type(None)]
        return " or ".join(kinds) + (" (optional)" if type(None) in args else "")
    if origin is tuple:
        return "array of tables" if args[-1] is Ellipsis else "[low, high]"
    if origin is dict:
        return "tables"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return TOML_TYPES.get(annotation, str(annotation))


def _toml_default(field: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    if field.default is PydanticUndefined:
        made = field.default_factory()
        return "see below" if isinstance(made, BaseModel) else "see the meaning"
    return _default(field.default).replace("unset", "none")


def topology_tables() -> list[tuple[str, Any]]:
    from bandgate.topology import model

    return [
        ("the top level", model.Topology),
        ("`[delay]`", model.DelaySettings),
        ("`[ledger]`", model.LedgerSettings),
        ("`[queues.<name>]`", model.QueueSpec),
        ("`retry` of a queue (`[queues.<name>.retry]`)", model.RetryPolicy),
        ("`[[queues.<name>.bands]]`, hottest first", model.Band),
    ]


def topology_section() -> str:
    from bandgate.topology import model

    parts = []
    for title, cls in topology_tables():
        rows = [
            (f"`{name}`", _toml_type(field.annotation), _toml_default(field), field.description)
            for name, field in cls.model_fields.items()
            if not (cls is model.QueueSpec and name == "name")  # the table's key names it
        ]
        parts.append(f"### {title}\n")
        parts.append(_table(("key", "type", "default", "meaning"), rows) + "\n")
    return "\n".join(parts).rstrip("\n")


# --- the Python API ------------------------------------------------------------------------

# Beside the names `bandgate` exports: what a handler's unit test uses, and the in-memory
# harness that tests a flow (docs/guides/testing.md).
TESTING_NAMES = {
    "bandgate.consumers.testing": ("deliver", "make_message"),
    "bandgate.testing": ("DeadLettered", "Harness", "Settlement"),
}


def python_names() -> list[tuple[str, Any]]:
    """(dotted name, object) of the Python API: `bandgate.__all__`, then the testing helpers."""
    import bandgate

    names = [(f"bandgate.{name}", getattr(bandgate, name)) for name in sorted(bandgate.__all__)]
    for module_name, exported in TESTING_NAMES.items():
        module = importlib.import_module(module_name)
        names += [(f"{module_name}.{name}", getattr(module, name)) for name in exported]
    return names


def _doc(obj: Any) -> str:
    return inspect.getdoc(obj) or ""


def _first_paragraph(obj: Any) -> str:
    return " ".join(_doc(obj).split("\n\n", 1)[0].split())


def _parameter(parameter: inspect.Parameter) -> str:
    """`name: annotation = default`, the annotation as written (they are strings here)."""
    text = parameter.name
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        text = f"*{text}"
    elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
        text = f"**{text}"
    if parameter.annotation is not inspect.Parameter.empty:
        annotation = parameter.annotation
        if not isinstance(annotation, str):
            annotation = inspect.formatannotation(annotation)
        text += f": {annotation}"
    if parameter.default is not inspect.Parameter.empty:
        text += f" = {parameter.default!r}"
    return text


def _signature(name: str, obj: Any) -> str:
    """`name(a, *, b: int = 1) -> str`, without `self` or `cls`."""
    signature = inspect.signature(obj)
    shown, star = [], False
    for parameter in signature.parameters.values():
        if parameter.name in ("self", "cls"):
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            shown.append("*")
        star = star or parameter.kind in (
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.VAR_POSITIONAL,
        )
        shown.append(_parameter(parameter))
    returns = signature.return_annotation
    arrow = "" if returns is inspect.Signature.empty else f" -> {returns}"
    return f"{name}({', '.join(shown)}){arrow}"


def members(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties `cls` defines itself (inherited ones aside)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        if isinstance(function, property) and function.fget is not None:
            found.append((name, function.fget))
        elif inspect.isfunction(function):
            found.append((name, function))
    return found


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f"`{field.name}`" for field in dataclasses.fields(cls)]
    return [f"`{key}`" for key in getattr(cls, "__annotations__", {}) if not key.startswith("_")]


def python_entry(dotted: str, obj: Any) -> str:
    short = dotted.rsplit(".", 1)[1]
    kind = (
        "exception"
        if isinstance(obj, type) and issubclass(obj, BaseException)
        else ("class" if isinstance(obj, type) else "function")
    )
    parts = [f"### `{dotted}`", "", f"{kind}, defined in `{obj.__module__}`", "", _doc(obj)]
    if kind == "function":
        parts[2:2] = ["```python", _signature(short, obj), "```", ""]
        return "\n".join(parts)
    if fields := _fields(obj):
        parts += ["", "Fields: " + ", ".join(fields) + "."]
    for name, member in members(obj):
        shown = _signature(name, member) if not isinstance(vars(obj)[name], property) else name
        parts += ["", f"- `{shown}`: {_first_paragraph(member)}"]
    return "\n".join(parts)


def python_section() -> str:
    return "\n\n".join(python_entry(dotted, obj) for dotted, obj in python_names())


# --- command line -------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    command: Any  # a typer (click) command


def commands() -> Iterator[Command]:
    import typer.main

    from bandgate.ops.cli import root

    def walk(command: Any, path: tuple[str, ...]) -> Iterator[Command]:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk(sub, (*path, name))
        elif not command.hidden:
            yield Command(path, command)

    yield from walk(typer.main.get_command(root), ("bandgate",))


def _usage(command: Command) -> str:
    words = list(command.path)
    for param in command.command.params:
        if param.param_type_name == "argument":
            name = param.name.upper() + ("..." if param.nargs != 1 else "")
            words.append(name if param.required else f"[{name}]")
    return " ".join(words) + " [OPTIONS]"


def _option_row(param: Any) -> tuple[str, ...]:
    names = ", ".join(f"`{opt}`" for opt in param.opts)
    if param.metavar:
        names += f" `{param.metavar}`"
    default = "required" if param.required else ""
    if not param.required and param.default not in (None, False):
        default = f"`{param.default}`"
    if param.envvar:
        default = f"{default}, `{param.envvar}`".lstrip(", ")
    if param.multiple:
        default = f"{default} (repeatable)".strip()
    return names, default, param.help or ""


def command_section(command: Command) -> str:
    help_text = (command.command.help or "").strip()
    arguments = [p for p in command.command.params if p.param_type_name == "argument"]
    options = [p for p in command.command.params if p.param_type_name == "option"]
    parts = [f"### `{' '.join(command.path)}`", "", "```", _usage(command), "```", "", help_text]
    if arguments:
        rows = [(f"`{p.name.upper()}`", p.help or "") for p in arguments]
        parts += ["", _table(("argument", "meaning"), rows)]
    if options:
        parts += ["", _table(("option", "default", "meaning"), [_option_row(p) for p in options])]
    return "\n".join(parts)


def cli_section() -> str:
    return "\n\n".join(command_section(command) for command in commands())


# --- error codes --------------------------------------------------------------------------


def errors_section() -> str:
    from bandgate.core.error_codes import REGISTRY

    ordered = sorted(REGISTRY.values(), key=lambda e: (e.status is None, e.status or 0))
    rows = [
        (str(e.status) if e.status is not None else "—", f"`{e.code}`", str(e.kind), e.meaning)
        for e in ordered
    ]
    return _table(("status", "code", "kind", "meaning"), rows)


# --- metrics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str  # as Prometheus shows it (a counter's `_total` included)
    kind: str
    labels: tuple[str, ...]
    help: str


def metrics() -> list[Metric]:
    from prometheus_client.metrics import MetricWrapperBase

    from bandgate.core.telemetry import Telemetry

    telemetry = Telemetry("docs-reference")
    try:
        found = []
        for value in vars(telemetry).values():
            if isinstance(value, MetricWrapperBase):
                [family] = value.describe()
                suffix = "_total" if family.type == "counter" else ""
                labels = tuple(value._labelnames)
                found.append(
                    Metric(family.name + suffix, family.type, labels, family.documentation)
                )
        return found
    finally:
        telemetry.shutdown()


def metrics_section() -> str:
    rows = [
        (f"`{m.name}`", m.kind, ", ".join(f"`{label}`" for label in m.labels), m.help)
        for m in metrics()
    ]
    return _table(("metric", "type", "labels", "what it counts"), rows)


# --- the pages ----------------------------------------------------------------------------

SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "configuration": ("configuration.md", configuration_section),
    "topology": ("topology.md", topology_section),
    "python": ("python.md", python_section),
    "cli": ("cli.md", cli_section),
    "errors": ("errors.md", errors_section),
    "metrics": ("metrics.md", metrics_section),
}


def _marker(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- reference:{name} -->\n)(.*?)(<!-- /reference:{name} -->)", re.S)


def rendered(name: str) -> str:
    """What the section's block should hold."""
    return SECTIONS[name][1]() + "\n"


def block(name: str) -> str:
    """What the page holds between the section's markers now (lines, each ending in \\n)."""
    page, _ = SECTIONS[name]
    found = _marker(name).search((REFERENCE / page).read_text(encoding="utf-8"))
    assert found is not None, f"no reference:{name} block in docs/reference/{page}"
    return found.group(2)


def write(name: str) -> bool:
    """Rewrite the section's block from the code; whether it changed."""
    path = REFERENCE / SECTIONS[name][0]
    text = path.read_text(encoding="utf-8")
    new = _marker(name).sub(lambda m: m.group(1) + rendered(name) + m.group(3), text, count=1)
    path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str]) -> int:
    stale = [name for name in SECTIONS if block(name) != rendered(name)]
    if "--check" in argv:
        for name in stale:
            print(f"docs/reference/{SECTIONS[name][0]}: the {name} block is stale", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        write(name)
        print(f"docs/reference/{SECTIONS[name][0]}: {name} rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
