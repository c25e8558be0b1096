"""AMQP 0-9-1 protocol: bytes <-> frames, connection and channel state."""
