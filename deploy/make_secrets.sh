#!/usr/bin/env bash
# Tokens and certificates for deploy/compose.yaml and deploy/k8s, written to deploy/secrets/ (git-ignored):
#   deploy/secrets/tokens/  node.tokens admin.tokens viewer.tokens client.tokens engine.token
#   deploy/secrets/tls/     ca.pem ca.key server.pem server.key admin.pem admin.key   (`kvpool certs cluster`)
# Run it once before `docker compose -f deploy/compose.yaml up`; for Kubernetes, load the same files as Secrets:
#   kubectl -n kvpool create secret generic kvpool-tokens --from-file=deploy/secrets/tokens/
#   kubectl -n kvpool create secret generic kvpool-tls --from-file=deploy/secrets/tls/server.pem \
#       --from-file=deploy/secrets/tls/server.key --from-file=deploy/secrets/tls/ca.pem
# Existing files are kept (so re-running never rotates anything by surprise). To rotate a token, add a new line to
# its file, move the callers to the new token, then delete the old line: servers re-read token files, no restart.
# The directory is 0700 and the files 0644: compose bind-mounts each file into containers that run as other users
# (kvpool 10001, prometheus 65534), so the directory, not the file, keeps other users of this host out.
# OUT (default deploy/secrets), TENANT (default team-a) and KVPOOL (the kvpool command) may be set.
set -euo pipefail
cd "$(dirname "$0")"
KVPOOL=${KVPOOL:-kvpool}
TENANT=${TENANT:-team-a}
OUT=${OUT:-secrets}
mkdir -p "$OUT/tokens" "$OUT/tls"
chmod 700 "$OUT"
cd "$OUT"
token() { python3 -c 'import secrets; print(secrets.token_hex(32))'; }
for role in node admin viewer; do
  [ -s "tokens/$role.tokens" ] || token > "tokens/$role.tokens"
done
if [ ! -s tokens/client.tokens ]; then
  line="$TENANT:$(token)"
  echo "$line" > tokens/client.tokens   # what the master accepts: every tenant's TENANT:TOKEN lines
  echo "$line" > tokens/engine.token    # what the engines present: their one tenant's line
fi
if [ ! -s tls/server.pem ]; then
  $KVPOOL certs cluster --out tls --host master --host node-1 --host node-2 \
    --host kvpool-master --host kvpool-master.kvpool.svc.cluster.local \
    --host '*.kvpool-node.kvpool.svc.cluster.local' > /dev/null
fi
chmod 644 tokens/* tls/*.pem tls/server.key
echo "secrets in $(pwd)"
