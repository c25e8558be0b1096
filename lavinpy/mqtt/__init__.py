"""MQTT 3.1 and 3.1.1: a second protocol face on the model (codec, sans-IO connection, asyncio adapter)."""
