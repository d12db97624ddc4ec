"""server/engines."""
