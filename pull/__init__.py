"""HTTP pull consumers: receive by priority with a visibility timeout, ack, release, extend.

A floor above both the gateway and the consumer library: an HTTP receiver is a consumer of the
library (`bandgate.consumers`) whose handler parks each message until an HTTP client settles
it, served from the gateway's process (`bandgate.pull.app`).
"""
