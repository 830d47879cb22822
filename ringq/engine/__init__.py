"""The storage engine: everything that knows the on-disk format and the C helper (docs/design.md)."""
