"""Multi-process integration tests: a collector, an agent server and a model server, each its own process."""
