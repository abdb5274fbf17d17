"""``berth bench``: Berth's benchmarks and their baselines, outside the product package.

The benchmarks drive Berth only through what a user has: its processes (``berth reconcile``,
``berth migrate``, ``berth keys create``, the API server), its HTTP API, and its database
schema as the migrations leave it (datasets are bulk-loaded with COPY, as a restore would).
From ``app`` they import only the public task spec model (to store specs as the API does),
the tenant-to-shard function, the wakeup channel, the settings and the embedded PostgreSQL.
``app`` never imports this package.

Targets: ``e2e`` (reconcilers placing a generated dataset, with four baselines in the same
run: the naive scheduler, the SQL floor on Berth's schema and a minimal one on its own
tables, a peer PostgreSQL queue) and ``api`` (HTTP
throughput of submissions and reads). ``docs/benchmarks.md`` gives the figures and how to
reproduce them.
"""
