#!/usr/bin/env bash
# Runs the README's first Quick start command exactly as the README spells
# it (the first ```sh block of its "Quick start" section), from the
# repository's root. .ci/run calls this after scripts/test.sh, so CI keeps
# the README's promise: both commands work as written on a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."
command=$(awk '
  /^## Quick start/ { in_section = 1; next }
  in_section && /^## / { exit }
  in_section && /^```sh/ { in_block = 1; next }
  in_block && /^```/ { exit }
  in_block { print }
' README.md)
if [ -z "$command" ]; then
  echo "quickstart: no sh block in the README's Quick start section" >&2
  exit 1
fi
echo "== README quick start: $command"
bash -euo pipefail -c "$command"
