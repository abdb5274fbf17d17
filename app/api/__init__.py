"""HTTP API v1: one module per resource, each with its own router and schemas."""
