"""The top floor: the `bandgate` command line and the operator tools (dlq, stats, doctor, the
private dev broker). Imports every floor below; nothing imports it.

It needs the `gateway` extra: without it, importing it (the `bandgate` command does) says so in
one line instead of failing on whichever import comes first."""

from importlib.util import find_spec

_GATEWAY_EXTRA = ("starlette", "uvicorn", "rich")
_missing = [name for name in _GATEWAY_EXTRA if find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"the bandgate command line needs the gateway extra ({', '.join(_missing)} not "
        "installed): pip install 'bandgate[gateway]'. A worker alone runs without it: "
        "python -m bandgate.consumers module:app",
        name=_missing[0],
    )
