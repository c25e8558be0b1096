"""MQTT 3.1, 3.1.1 and 5.0: a second protocol face on the model (codec, sans-IO connection, asyncio adapter)."""
