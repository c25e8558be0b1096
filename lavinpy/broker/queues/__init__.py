"""Queue kinds (classic, stream), their features and their consumers."""
