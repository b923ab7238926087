#!/usr/bin/env bash
# Runs each unit-test binary, shows failures in full, and ends with the total
# "N passed, N failed" line. Exit status is non-zero if any check failed or any
# binary crashed or planned nothing.
set -u
pass=0 fail=0 broken=0
for t in "$@"; do
	out=$("$t" 2>&1); rc=$?
	p=$(grep -c '^ok ' <<<"$out"); f=$(grep -c '^not ok ' <<<"$out")
	pass=$((pass + p)); fail=$((fail + f))
	if [ $rc -ne 0 ] || [ "$f" -ne 0 ] || [ "$p" -eq 0 ]; then
		broken=$((broken + 1))
		echo "== $t (exit $rc)"; echo "$out" | grep -v '^ok ' | tail -60
	else
		echo "  unit   $(basename "$t"): $p ok"
	fi
done
echo "unit: $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $broken -eq 0 ]
