"""The directory-backed queue, composed of its parts (docs/design.md)."""
