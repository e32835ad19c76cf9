#!/usr/bin/env bash
# bench/remote_cache_bench.sh: the remote cache tier (Redis on this host) against a cold compile
# and a disk hit, in fresh processes, for the four seed chains; then `fusejit prewarm --remote`
# of a 60-chain manifest into an empty Redis, and again from a machine with an empty disk cache.
# Starts its own redis-server on a free loopback port. Prints Markdown (BENCHMARKS.md, "Remote
# cache (Redis)"): medians of REPS runs (default 3) of `fusejit compile`'s "total" line (the
# Compile call) and of the whole process.
#
#   bash bench/remote_cache_bench.sh [BUILD_DIR [ARCH]]     # defaults: build, sm_90
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
arch=${2:-sm_90}
reps=${REPS:-3}
cli=$build/tools/fusejit
[ -x "$cli" ] || { echo "no $cli: build first" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "no redis-server (scripts/install-deps.sh)" >&2; exit 1; }
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  --logfile "$work/redis.log" --daemonize no &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; wait $redis_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
export FUSEJIT_REMOTE_CACHE="redis://127.0.0.1:$port"
unset FUSEJIT_DISABLE_CACHE

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
n=0
# one DIR SPEC EXPECT: fusejit compile in a fresh process on cache DIR; sets total (ms), proc (ms)
one() {
  local t0 t1 out
  t0=$(date +%s%N)
  out=$(FUSEJIT_CACHE_DIR="$1" "$cli" compile "$2" --arch "$arch")
  t1=$(date +%s%N)
  grep -q "cache:     $3" <<<"$out" || { echo "expected cache $3: $out" >&2; exit 1; }
  total=$(sed -nE 's/^total: +([0-9.]+) ms/\1/p' <<<"$out")
  proc=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", (b - a) / 1e6}')
}

echo "| chain | cold compile (Compile / process) | remote hit | disk hit | entry |"
echo "|---|---|---|---|---|"
mapfile -t specs < <(grep -v '^#' "$here/seeds_manifest.txt" | sed -E 's/ *#.*//' | grep .)
names=(W1 W2 W3 W4)
for i in "${!specs[@]}"; do
  spec=${specs[$i]}
  cold_t=() cold_p=() remote_t=() remote_p=() disk_t=() disk_p=()
  for r in $(seq "$reps"); do
    redis-cli -p "$port" flushall >/dev/null
    n=$((n + 1)); d1="$work/m$n"; one "$d1" "$spec" miss; cold_t+=("$total"); cold_p+=("$proc")
    n=$((n + 1)); d2="$work/m$n"; one "$d2" "$spec" hit; remote_t+=("$total"); remote_p+=("$proc")
    one "$d2" "$spec" hit; disk_t+=("$total"); disk_p+=("$proc")
  done
  bytes=$(redis-cli -p "$port" --no-raw eval 'local n=0 for _,k in ipairs(redis.call("keys","fusejit:*.fjk")) do n=n+redis.call("strlen",k) end return n' 0 | tr -dc 0-9)
  printf "| %s | %s / %s ms | %s / %s ms | %s / %s ms | %s B |\n" "${names[$i]}" \
    "$(echo "${cold_t[*]}" | median)" "$(echo "${cold_p[*]}" | median)" \
    "$(echo "${remote_t[*]}" | median)" "$(echo "${remote_p[*]}" | median)" \
    "$(echo "${disk_t[*]}" | median)" "$(echo "${disk_p[*]}" | median)" "$bytes"
done

echo
manifest=$here/remote_prewarm_manifest.txt
redis-cli -p "$port" flushall >/dev/null
for step in "empty Redis, empty disk:$work/p1" "filled Redis, empty disk:$work/p2" \
            "filled Redis, filled disk:$work/p2"; do
  dir=${step##*:}
  out=$("$cli" prewarm "$manifest" --arch "$arch" --jobs "$(nproc)" --cache-dir "$dir" --remote 2>/dev/null)
  echo "prewarm --remote ($(nproc) jobs), ${step%%:*}:"
  grep -E "^  (compiled|already cached|wall time|remote) " <<<"$out" | sed 's/^/    /'
done
echo "redis: $(redis-cli -p "$port" dbsize) keys, used_memory $(redis-cli -p "$port" info memory | sed -nE 's/^used_memory_human:(.*)\r?$/\1/p')"
