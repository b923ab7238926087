#!/usr/bin/env bash
# Installs what kwc needs on a fresh Debian bookworm machine: Debian packages via
# apt-get (as root; otherwise prints the exact command and fails) and the npm
# packages the integration tests use, into tests/integration/node_modules.
#   deps.sh build|test|bench   (each includes the ones before it)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
level=${1:-build}

build_pkgs="gcc make pkg-config libevent-dev libhttp-parser-dev libjansson-dev
 libprotobuf-c-dev protobuf-c-compiler liblmdb-dev libcurl4-openssl-dev libyaml-dev
 libssl-dev uthash-dev python3"
test_pkgs="python3-kubernetes python3-crc32c python3-protobuf clang libclang-rt-14-dev valgrind lmdb-utils nodejs npm curl"
bench_pkgs="etcd-server etcd-client libnghttp2-dev gnuplot-nox wrk openssl"

pkgs=$build_pkgs
case $level in
build) ;;
test) pkgs="$pkgs $test_pkgs" ;;
bench) pkgs="$pkgs $test_pkgs $bench_pkgs" ;;
*) echo "deps.sh: unknown level '$level' (use build, test or bench)" >&2; exit 2 ;;
esac

missing=""
for p in $pkgs; do
	# nodejs/npm may come from outside Debian (the base image has Node 20): accept the commands.
	case $p in
	nodejs) command -v node >/dev/null && continue ;;
	npm) command -v npm >/dev/null && continue ;;
	esac
	st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$st" = installed ] || missing="$missing $p"
done

if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "kwc: missing Debian packages:$missing" >&2
		echo "kwc: install them with: sudo apt-get install -y$missing" >&2
		exit 1
	fi
	echo "kwc: installing Debian packages:$missing" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends $missing >&2
fi

if [ "$level" != build ]; then
	nm="$top/tests/integration/node_modules/@kubernetes/client-node/package.json"
	if [ ! -f "$nm" ]; then
		echo "kwc: installing npm packages into tests/integration/node_modules" >&2
		(cd "$top/tests/integration" && npm ci --no-audit --no-fund --loglevel=error >&2)
	fi
fi
