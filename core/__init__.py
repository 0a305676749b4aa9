"""The shared core under the gateway and the consumers: the broker link, the confirm pipeline,
the publisher and its outcomes, the Python producer, telemetry, queue stats and dead-letter
access."""
