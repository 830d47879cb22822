"""Read-only views of a queue for people and scrapers: the dashboard and Prometheus metrics."""
