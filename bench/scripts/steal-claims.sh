#!/bin/bash
# steal-claims.sh BIN N [BATCHES]: the claims work stealing sends, on N real
# `kvmesh serve` processes on loopback (ports 0, read back from ready files;
# 16 MiB DRAM each, the bundled engine, --gossip-profile local).
#   BATCHES 0 or absent: the cluster idles for 20 s; prints the claims each
#     node sent per second (kvmesh_queue_claims_total over all nodes).
#   BATCHES > 0: n0 runs no queued work (--queue-share 0) and is given
#     BATCHES batches of 4 requests; the others must steal them. Prints the
#     time until all completed and the claims sent meanwhile.
# Issue 35: before the stealing fix every idle node asked every peer each
# --queue-steal-interval (1 s); BENCHMARKS.md has both binaries' figures.
set -u
BIN=$1 N=$2 B=${3:-0}
D=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$D"' EXIT
start() { # id seed extra-flags...
  local id=$1 seed=$2
  shift 2
  mkdir -p "$D/$id"
  local j=()
  [ -n "$seed" ] && j=(--join "$seed")
  nice "$BIN" serve --node-id "$id" --data-dir "$D/$id" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
    --data-addr 127.0.0.1:0 --gossip-addr 127.0.0.1:0 --ready-file "$D/$id.ready" --dram 16777216 --nvme 0 \
    --log-level warn --gossip-profile local "${j[@]}" "$@" >"$D/$id.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do [ -s "$D/$id.ready" ] && return; sleep 0.1; done
  echo "$id did not start: $(tail -3 "$D/$id.log")" >&2
  exit 1
}
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
if [ "$B" -gt 0 ]; then start n0 "" --queue-share 0; else start n0 ""; fi
seed=$(field "$D/n0.ready" gossip_addr)
for i in $(seq 1 $((N - 1))); do start "n$i" "$seed"; done
http=()
for i in $(seq 0 $((N - 1))); do http+=("$(field "$D/n$i.ready" http_addr)"); done
metric() { # the sum over the nodes of the series whose line starts with $1
  for h in "${http[@]}"; do curl -s "http://$h/metrics"; done | awk -v m="$1" 'index($0, m) == 1 {s += $2} END {print s + 0}'
}
sleep 5 # gossip settles
c0=$(metric kvmesh_queue_claims_total)
t0=$(date +%s.%N)
if [ "$B" -eq 0 ]; then
  sleep 20
else
  ids=()
  for b in $(seq 1 "$B"); do
    r='{"model":"kvmesh","prompt":"stolen work '$b'","max_tokens":4,"temperature":0}'
    ids+=("$(curl -s -X POST "http://${http[0]}/v1/queue" -H 'Content-Type: application/json' \
      -d '{"requests":['"$r,$r,$r,$r"']}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["request_id"])')")
  done
  for id in "${ids[@]}"; do
    for _ in $(seq 1 3000); do
      s=$(curl -s "http://${http[0]}/v1/queue/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])')
      [ "$s" = completed ] && break
      sleep 0.1
    done
  done
fi
t1=$(date +%s.%N)
c1=$(metric kvmesh_queue_claims_total)
lent=$(metric 'kvmesh_queue_claims_total{answer="lent"}')
python3 -c "
n, b, d, t, lent = $N, $B, $c1 - $c0, $t1 - $t0, $lent
what = 'idle' if b == 0 else f'{b} batches drained'
print(f'nodes {n}, {what} in {t:.1f} s: claims {d:.0f} ({lent:.0f} lent), {d / t / n:.2f} per node per second')"
