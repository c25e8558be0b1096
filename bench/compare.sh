#!/usr/bin/env bash
# Side-by-side benchmark: lavinpy (fsync always and never), LavinMQ 1.0.0 and RabbitMQ (Debian),
# with amqpperf, all on loopback, a fresh broker per run.
# Usage: bench/compare.sh [--scenarios a,b,c,d,e,cpu] [--rounds 2] [--brokers lavinpy,lavinpy-never,lavinmq,rabbitmq]
# Installs what it needs (rabbitmq-server, golang-go, LavinMQ's runtime libraries), builds amqpperf
# from the shared tools directory into bench/out/, and runs bench/compare.py.
set -euo pipefail
cd "$(dirname "$0")/.."
AMQPPERF_SRC=${AMQPPERF_SRC:-../shared/tools/amqpperf}

need_apt=()
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need_apt+=(rabbitmq-server)
command -v go >/dev/null || need_apt+=(golang-go)
# LavinMQ 1.0.0's runtime libraries (see the shared tools directory's README)
for lib in libgc1 libevent-2.1-7 libpcre3 libssl3 zlib1g; do
  dpkg -s "$lib" >/dev/null 2>&1 || need_apt+=("$lib")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  # The package starts a system-wide node on 5672; the comparison runs its own private node.
  (service rabbitmq-server stop || rabbitmqctl stop) >/dev/null 2>&1 || true
fi
python3 -m pip install --quiet -e '.[test]'

mkdir -p bench/out
if [ ! -x bench/out/amqpperf ]; then
  (cd "$AMQPPERF_SRC" && ./build.sh "$OLDPWD/bench/out/amqpperf")
fi
exec python3 bench/compare.py --amqpperf bench/out/amqpperf "$@"
