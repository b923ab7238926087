#!/usr/bin/env bash
# make check-format: every C file of the tree is as clang-format 14 (Debian
# bookworm's clang-format-14, the version pinned here and in the README) writes
# it under .clang-format; make format rewrites them in place.
#   check-format.sh [check|fix]
# Generated files are left out (tests/unit/pb_vectors.h and pom_vectors.h: the
# .py of the same name writes each).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-check}
cf=${CLANG_FORMAT:-clang-format-14}
want=14

if ! command -v "$cf" >/dev/null; then
	echo "check-format: $cf not found; install Debian's clang-format-14 (make deps-test does)" >&2
	exit 2
fi
ver=$("$cf" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$ver" != "$want" ]; then
	echo "check-format: $cf is clang-format $ver; the tree is formatted by clang-format $want" \
		"(another version formats differently): set CLANG_FORMAT to a clang-format-$want" >&2
	exit 2
fi

mapfile -t files < <(find cache proxy include tests/unit tests/fuzz bench \
	-type f \( -name '*.c' -o -name '*.h' \) ! -path tests/unit/pb_vectors.h ! -path tests/unit/pom_vectors.h | LC_ALL=C sort)

case $mode in
fix)
	"$cf" -i "${files[@]}"
	;;
check)
	bad=()
	for f in "${files[@]}"; do
		"$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
	done
	if [ ${#bad[@]} -gt 0 ]; then
		echo "check-format: ${#bad[@]} file(s) differ from what $cf writes:" >&2
		for f in "${bad[@]}"; do
			n=$("$cf" --dry-run "$f" 2>&1 | grep -c 'clang-format-violations' || true)
			echo "  $f ($n spot(s); see them: $cf --dry-run $f)" >&2
		done
		echo "check-format: fix with: make format" >&2
		exit 1
	fi
	;;
*)
	echo "check-format.sh: unknown mode '$mode' (check or fix)" >&2
	exit 2
	;;
esac
