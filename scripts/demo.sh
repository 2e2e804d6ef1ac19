#!/usr/bin/env bash
# The main job on embedded defaults: a local server with SQLite, a local
# checkpoint directory, a generated CA, a tenant enrolled and approved, a real
# 2-worker job trained to completion, and an audit report at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO=${DEMO_DIR:-$PWD/.demo}
PORT=${DEMO_PORT:-7443}
rm -rf "$DEMO"
mkdir -p "$DEMO"
export CANTATA_HOME="$DEMO/home"
started=$(date +%s)

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "cantata server init (CA, server certificate, audit key, SQLite, admin profile)"
cantata server init --data-dir "$DEMO/data" --listen "127.0.0.1:$PORT"

step "cantata server start"
cantata server start --data-dir "$DEMO/data" > "$DEMO/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q "listening on port" "$DEMO/server.log" && break
  kill -0 $SERVER 2>/dev/null || { cat "$DEMO/server.log"; exit 1; }
  sleep 0.2
done

step "cantata tenant request demo (key and CSR made locally)"
FP=$(cantata tenant request demo --server "127.0.0.1:$PORT" --ca-file "$DEMO/data/ca.pem" --json \
     | python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')
echo "CSR fingerprint: $FP"

step "cantata admin tenants list / approve"
cantata admin tenants list
cantata admin tenants approve demo --fingerprint "$FP"

step "cantata tenant status demo (fetches the certificate)"
cantata tenant status demo

step "cantata jobs submit: a 2-worker data-parallel gpt-tiny job, watched to completion"
cantata jobs submit --profile demo --name demo-allreduce --model gpt-tiny --dataset builtin:pystdlib \
  --algorithm allreduce --workers 2 --steps 300 --eval-every 100 --checkpoint-every 100 --watch \
  | tee "$DEMO/job.txt"
JOB=$(awk '{print $1}' "$DEMO/job.txt" | tail -1)

step "final validation loss"
cantata jobs status "$JOB" --profile demo --json \
  | python3 -c 'import json,sys; j=json.load(sys.stdin); print("%s: %s, validation loss %.4f" % (j["id"], j["state"], j["val_loss"]))'
cantata checkpoints list "$JOB" --profile demo
cantata jobs plot "$JOB" --profile demo --out "$DEMO/loss.png"

step "cantata server stop (SIGTERM: graceful)"
kill -TERM $SERVER
wait $SERVER || true
trap - EXIT

step "cantata audit verify / report"
cantata audit verify --data-dir "$DEMO/data"
cantata audit report --data-dir "$DEMO/data" --format text
cantata audit report --data-dir "$DEMO/data" --format html --out "$DEMO/audit-report.html"
echo "HTML audit report: $DEMO/audit-report.html"

echo
echo "demo finished in $(( $(date +%s) - started )) s"
