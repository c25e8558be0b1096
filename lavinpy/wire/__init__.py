"""AMQP 0-9-1 wire codecs shared by every layer (standard library and pamqp only)."""
