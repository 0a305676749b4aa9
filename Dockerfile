# The bandgate image: the gateway (the default command) and workers (`bandgate worker module:app`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

COPY pyproject.toml README.md ./
COPY topology ./topology
COPY gateway ./gateway
COPY consumers ./consumers
RUN pip install . && rm -rf build *.egg-info

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
