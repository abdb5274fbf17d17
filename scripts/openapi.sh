#!/usr/bin/env bash
# Regenerate docs/openapi.json from the code, and optionally a Python client from it.
#
#   scripts/openapi.sh                 # rewrite docs/openapi.json
#   scripts/openapi.sh --client DIR    # also generate the `berth_client` package into DIR
#
# No database is needed: the app is built, never started.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m app.cli openapi --output docs/openapi.json.tmp
mv docs/openapi.json.tmp docs/openapi.json
echo "wrote docs/openapi.json"
if [[ "${1:-}" == "--client" ]]; then
  out="${2:?usage: scripts/openapi.sh --client DIR}"
  python -m openapi_python_client generate --path docs/openapi.json --meta none \
    --output-path "$out/berth_client" --overwrite
  echo "wrote the berth_client package to $out/berth_client"
fi
