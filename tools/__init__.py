"""Developer and test tooling: never imported by the gateway, the consumers or the topology."""
