"""Definitions documents: check, import and export (they run the admin operations)."""
