"""Channel adapters: one transport-only child per configured profile (docs/CHANNELS.md)."""
