"""The same queue API on Redis (docs/scale-out.md)."""
