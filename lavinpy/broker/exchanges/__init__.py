"""Exchange types, one module each."""
