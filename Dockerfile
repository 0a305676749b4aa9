# The bandgate image: the gateway (the default command) and workers (`bandgate worker module:app`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The package's sources, built and installed from /src, then removed. The import package
# bandgate/ holds one link per floor (bandgate/core -> ../core, ...): COPY keeps the links as
# they are and setuptools packages each floor through its link, so every floor a link points
# to is copied beside it (tests/unit/test_compose.py checks that). Building outside /app leaves
# the working directory without a second `bandgate` that `python` started there would import.
COPY pyproject.toml README.md /src/
COPY bandgate /src/bandgate
COPY topology /src/topology
COPY core /src/core
COPY gateway /src/gateway
COPY consumers /src/consumers
COPY pull /src/pull
COPY ops /src/ops
COPY testing /src/testing
# The `all` extra: the gateway and its console (Starlette, uvicorn) and the OTLP exporter, beside
# what a worker needs.
RUN pip install "/src[all]" && rm -rf /src

# The shipped topology, and the example worker `bandgate worker examples.worker:app` imports from
# the working directory.
COPY bandgate.toml ./
COPY examples ./examples

RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin bandgate
USER bandgate

ENV BANDGATE_TOPOLOGY=/app/bandgate.toml
EXPOSE 8000
CMD ["bandgate", "gateway", "--host", "0.0.0.0"]
