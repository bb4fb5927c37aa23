"""The asyncio shell around the sans-IO protocol and the core objects."""
