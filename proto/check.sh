#!/usr/bin/env bash
# Checks the gRPC contract (proto/kvmesh/v1) with buf, pinned by
# proto/tools/package-lock.json (install it first: cd proto/tools && npm ci):
#
#   bash proto/check.sh
#
# 1. buf lint: the STANDARD rules of buf.yaml.
# 2. buf breaking: the contract against the last released one, the snapshot
#    in proto/released (see its README.md). Adding fields, messages, RPCs or
#    enum values passes; removing or renaming any, or changing a field's
#    number or type, fails.
# 3. The check itself: a copy of the contract with one field removed must
#    fail step 2, so that a check which silently compares nothing (a wrong
#    path, an empty baseline) fails CI instead of passing it.
set -euo pipefail
cd "$(dirname "$0")/.."

buf=proto/tools/node_modules/.bin/buf
if [[ ! -x $buf ]]; then
	echo "proto/check.sh: buf is not installed: cd proto/tools && npm ci" >&2
	exit 1
fi
"$buf" --version

echo "buf lint"
"$buf" lint

# buf refuses a baseline inside the module (proto/), so it is compared from
# a copy.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp -r proto/released "$tmp/released"
rm -f "$tmp/released/README.md"
echo "buf breaking --against proto/released"
"$buf" breaking --against "$tmp/released"

echo "buf breaking detects a removed field"
mkdir -p "$tmp/mutated"
cp -r proto/kvmesh "$tmp/mutated/kvmesh"
sed -i '/uint32 head_dim = 7;/d' "$tmp/mutated/kvmesh/v1/types.proto"
if grep -q 'head_dim = 7;' "$tmp/mutated/kvmesh/v1/types.proto" ||
	! grep -q 'head_dim = 7;' "$tmp/released/kvmesh/v1/types.proto"; then
	echo "proto/check.sh: the self-check's field (Namespace.head_dim) moved; pick another" >&2
	exit 1
fi
if "$buf" breaking "$tmp/mutated" --against "$tmp/released" >"$tmp/out" 2>&1; then
	echo "proto/check.sh: buf breaking passed a contract with Namespace.head_dim removed" >&2
	exit 1
fi
grep -q '"head_dim"' "$tmp/out" || { cat "$tmp/out" >&2; echo "proto/check.sh: buf breaking failed for another reason" >&2; exit 1; }
echo "ok: $(head -1 "$tmp/out")"
