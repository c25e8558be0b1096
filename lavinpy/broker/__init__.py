"""Broker model: vhosts, exchanges, queues, consumers, users."""
