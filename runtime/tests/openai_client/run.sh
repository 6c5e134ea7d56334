#!/usr/bin/env bash
# Runs test_openai.py against a `sov serve` started here: the default model on the CPU, loopback,
# a free port, an API key, state in a temporary directory; the server is stopped afterwards.
# Usage: runtime/tests/openai_client/run.sh [path/to/sov]   (default: target/release/sov)
# Needs the packages in requirements.txt (`python3 -m pip install -r requirements.txt`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sov="${1:-$here/../../../target/release/sov}"
tmp="$(mktemp -d)"
log="$tmp/serve.log"
export SOV_API_KEY="test-$RANDOM$RANDOM"
SOV_STATE_DIR="$tmp/state" SOV_CONFIG_DIR="$tmp/config" \
  "$sov" serve --device cpu --host 127.0.0.1 --port 0 --run-dir "$tmp/run" 2>"$log" &
pid=$!
stop() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap stop EXIT
base=""
for _ in $(seq 1 600); do
  base="$(sed -n 's/^sov: serving on \(http:[^ ]*\).*/\1/p' "$log" | head -n 1)"
  [ -n "$base" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "sov serve exited:"; cat "$log"; exit 1; }
  sleep 0.5
done
[ -n "$base" ] || { echo "sov serve did not start in 300 s:"; cat "$log"; exit 1; }
echo "sov serve at $base"
status=0
SOV_BASE_URL="$base" python3 -m unittest discover -v -s "$here" -p 'test_*.py' || status=$?
if [ "$status" -ne 0 ]; then
  echo "== sov serve log (last 40 lines)"
  tail -n 40 "$log"
fi
exit "$status"
