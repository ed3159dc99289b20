#!/usr/bin/env bash
# On the GPU machine, which has no network: install rlhf's requirements (pyproject.toml) from the carried wheels
# (benchmarks/gpu_setup/wheels/, made by prepare_wheels.sh) and the packages the machine already has.
#
# pip resolves the requirements against what is installed there, so only what is missing or out of rlhf's
# range comes from the wheels (transformers 5.17 -> 5.24.0; trl, deepspeed, datasets, pydantic, ... added).
# If they do not resolve (a package the machine has in a version the wheels cannot replace, such as a pyarrow
# older than datasets' >=24), pip's reason is printed and every carried wheel is installed without dependency
# checks instead: the GPU check then still runs, and its gpu.md lists every version that ran.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
wheels="$here/wheels"
if ! ls "$wheels"/*.whl > /dev/null 2>&1; then
    echo "no wheels in $wheels: run benchmarks/gpu_setup/prepare_wheels.sh first and carry that folder" >&2
    exit 2
fi
requirements="$(mktemp)"
python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$repo/pyproject.toml" > "$requirements" || exit 2

echo "installed before:"
python3 -m pip list 2>/dev/null | grep -iE '^(torch|transformers|accelerate|trl|deepspeed|datasets|peft|pydantic|pyarrow|fsspec|typer|regex|tokenizers|huggingface.hub|typing.extensions|safetensors) ' || true
options=(--no-index --find-links "$wheels" --no-cache-dir --no-compile --disable-pip-version-check)
if python3 -m pip install --quiet "${options[@]}" -r "$requirements"; then
    echo "rlhf's requirements installed from the machine's packages and the carried wheels"
else
    echo "WARNING: rlhf's requirements do not resolve here (pip's reason above); installing every carried wheel" \
         "without dependency checks" >&2
    python3 -m pip install --quiet "${options[@]}" --no-deps "$wheels"/*.whl || exit 3
fi
python3 -m pip list 2>/dev/null | grep -iE '^(transformers|trl|deepspeed|datasets|pydantic) '
