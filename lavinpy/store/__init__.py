"""Storage: segments, message store, queue indexes, definitions, JSON files."""
