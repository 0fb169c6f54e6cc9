#!/usr/bin/env bash
# Refuses unbounded or unchecked libc calls in the project's C sources.
set -euo pipefail
root=${1:-.}
hits=$(grep -rnE '\b(sprintf|vsprintf|strcpy|strcat|strncpy|gets|atoi|atol|strtok)\s*\(' \
  --include='*.c' --include='*.h' --include='*.cu' \
  "$root/base" "$root/rendezvous" "$root/runtime" "$root/launcher" "$root/examples" "$root/test" || true)
if [ -n "$hits" ]; then
  echo "banned functions (use snprintf, memcpy with lengths, strtol with checks):" >&2
  echo "$hits" >&2
  exit 1
fi
