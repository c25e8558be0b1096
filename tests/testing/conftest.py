"""The plugin's fixtures for these tests, whether or not the installed lavinpy registered its entry point
(an editable install made before the entry point existed did not): a conftest's fixtures of the same
name take the place of the plugin's."""

from lavinpy.testing.plugin import lavinpy_broker, lavinpy_vhost

__all__ = ["lavinpy_broker", "lavinpy_vhost"]
