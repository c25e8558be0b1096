"""The management HTTP API (RabbitMQ-compatible), served by aiohttp in the broker's event loop."""
