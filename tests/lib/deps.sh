#!/usr/bin/env bash
# Installs what kwc needs on a fresh Debian bookworm machine: Debian packages via
# apt-get (as root; otherwise prints the exact command and fails) and the npm
# packages the integration tests use, into tests/integration/node_modules.
#   deps.sh build|test|bench   (each includes the ones before it)
#   deps.sh image              the container tool for `make image` (podman) only
#   deps.sh image-test         that, runc and debootstrap (make image-test) and the test packages
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
level=${1:-build}

build_pkgs="gcc libc6-dev make pkg-config libevent-dev libhttp-parser-dev libjansson-dev
 libprotobuf-c-dev protobuf-c-compiler liblmdb-dev libcurl4-openssl-dev libyaml-dev
 libssl-dev uthash-dev libnghttp2-dev zlib1g-dev python3"
# python3-yaml, systemd (systemd-analyze), util-linux (unshare, setpriv) and
# openssl: tests/integration/21_deploy.py (manifests, unit file, a pod-like sandbox);
# prometheus: promtool and a real server for tests/integration/22_metrics.py;
# clang-format-14: make check-format (the version the tree is formatted with);
# nghttp2-client: nghttp and h2load against kwc's HTTP/2 (tests/integration/26_http2.py);
# python3-h2: the tests' HTTP/2 client (tests/lib/h2client.py, make integration-h2)
# haproxy: the load balancer in front of two kwc replicas (tests/integration/35_rollout.py)
test_pkgs="python3-kubernetes python3-crc32c python3-protobuf clang clang-format-14 libclang-rt-14-dev valgrind lmdb-utils nodejs npm curl
 python3-yaml systemd util-linux openssl prometheus nghttp2-client python3-h2 haproxy"
bench_pkgs="etcd-server etcd-client libnghttp2-dev gnuplot-nox wrk openssl"

image_pkgs="podman"
# runc: Debian's podman picks crun, which cannot run on a hybrid cgroup v1/v2
# host; debootstrap: the bookworm base images when no registry is reachable
image_test_pkgs="$image_pkgs runc debootstrap"

pkgs=$build_pkgs
case $level in
build) ;;
image) pkgs=$image_pkgs ;;
image-test) pkgs="$pkgs $test_pkgs $image_test_pkgs" ;;
test) pkgs="$pkgs $test_pkgs" ;;
bench) pkgs="$pkgs $test_pkgs $bench_pkgs" ;;
*) echo "deps.sh: unknown level '$level' (use build, test, bench, image or image-test)" >&2; exit 2 ;;
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

if [ "$level" = test ] || [ "$level" = bench ]; then
	nm="$top/tests/integration/node_modules/@kubernetes/client-node/package.json"
	if [ ! -f "$nm" ]; then
		echo "kwc: installing npm packages into tests/integration/node_modules" >&2
		(cd "$top/tests/integration" && npm ci --no-audit --no-fund --loglevel=error >&2)
	fi
fi
