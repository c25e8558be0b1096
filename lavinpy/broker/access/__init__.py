"""Users, permissions, authentication and client limits."""
