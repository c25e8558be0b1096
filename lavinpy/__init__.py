"""lavinpy: an AMQP 0-9-1 message broker with LavinMQ-style storage."""

__version__ = "0.1.0"
