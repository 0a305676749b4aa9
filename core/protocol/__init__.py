"""The protocol home: every line of bandgate that writes or reads AMQP frames itself, or touches
a private part of aiormq, pamqp or uvicorn, and the version guard that keeps those lines honest.

Each shortcut here was measured against the library's own path (the module docstrings give the
figures) and is tested against the real library, value for value or on a real broker:

- `compat`: the versions of aiormq, pamqp, aio-pika and uvicorn this code was written for,
  checked when a module here is imported (`IncompatibleLibrary` outside them), and the only
  reads of name-mangled attributes (`unblocked_event`, `close_event`).
- `confirms`: confirmed publishing, a loop turn's publishes in one socket write, on aiormq's
  confirm bookkeeping.
- `content_header`: a publish's content header frame, written with `struct`.
- `frames`: a delivery's `basic.deliver` and content header, read with `struct`; a worker may
  put it in place of `pamqp.frame.unmarshal` for its process (`BANDGATE_FAST_FRAMES`).
- `acks`: a loop turn's acks written as one payload, joined into `multiple` acks.
- `deliveries`: a delivery as a worker reads it, straight from aiormq.

The one adapter that is not here is uvicorn's: `bandgate.gateway.http_server` subclasses its
httptools protocol and belongs to the gateway's install (`bandgate[gateway]`), which a worker
does not have; it calls `compat.check_uvicorn()` when imported.
"""
