"""The shared core under the gateway and the consumers: the broker link, the confirm pipeline,
the publisher, telemetry, queue stats and dead-letter access."""
