"""Every plugin name, in one place (they appear in explanations and metrics labels)."""

# The quota admission stage, before the pool filters (plugins/quota.py).
QUOTA = "quota"

# Filters, in pipeline order.
TENANT_ACCESS = "tenant_access"
POOL_STATUS = "pool_status"
HEALTH = "health"
RUNTIME_CLASS = "runtime_class"
REGION = "region"
DATA_RESIDENCY = "data_residency"
POOL_SELECTOR = "pool_selector"
CAPACITY = "capacity"
REQUIRED_AFFINITY = "required_affinity"

# Scores.
LEAST_LOADED = "least_loaded"
MOST_LOADED = "most_loaded"
COST = "cost"
PREFERRED_AFFINITY = "preferred_affinity"
FAILURE_DOMAIN_SPREAD = "failure_domain_spread"
ARTIFACT_LOCALITY = "artifact_locality"

# Not a plugin: the gang planner, named where its rejections are counted.
GANG = "gang"
