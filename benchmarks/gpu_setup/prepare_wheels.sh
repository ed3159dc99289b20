#!/usr/bin/env bash
# Here, with network: fill benchmarks/gpu_setup/wheels/ with what the GPU machine lacks, for CPython 3.12 on
# x86-64 Linux (the wheels of wheels.txt, and deepspeed built from its source), then print the sizes against
# the 64 MiB that may travel with one command (these wheels plus the repository's files).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
wheels="$here/wheels"
rm -rf "$wheels" && mkdir -p "$wheels"

requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/wheels.txt" | grep -v '^$' > "$requirements"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels" -r "$requirements"
# PyPI has deepspeed's source only. Built without its ops (the default), it is pure Python: DeepSpeed compiles
# an op on the machine that first needs it (the optimizer-offload run builds cpu_adam there, with ninja).
# Its build imports torch, so it uses this machine's (--no-build-isolation) instead of downloading one.
python3 -m pip wheel --quiet --no-deps --no-build-isolation -w "$wheels" deepspeed==0.19.8

ls -l "$wheels"/*.whl | awk '{printf "%8.1f MiB  %s\n", $5 / 1048576, $9}'
wheel_bytes=$(cat "$wheels"/*.whl | wc -c)
tree_bytes=$(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
total=$((wheel_bytes + tree_bytes))
awk -v w="$wheel_bytes" -v t="$tree_bytes" 'BEGIN { printf "wheels %.1f MiB + repository files %.1f MiB = %.1f MiB of the 64 MiB that may travel\n", w / 1048576, t / 1048576, (w + t) / 1048576 }'
if [ "$total" -gt $((64 * 1048576)) ]; then
    echo "too large to travel: leave a wheel out of wheels.txt" >&2
    exit 1
fi
