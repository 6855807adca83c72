#!/usr/bin/env bash
# The wheels a device call carries (`carry: [".whl"]`), in one step: the shared set that was checked to import on
# the GPU machine (../shared/gpu/wheels.sh: the server, gguf, openai, dflash), plus what minillm's GPU tests need
# beyond it: llguidance (the structured-output engine tests fail without it: part239, part359) and jsonschema's
# set (test_responses.py and test_tool_calling.py do not import without it: part285).
#   bash scripts/gpu_wheels.sh [DEST]      # default .whl (ignored by git); ~10 MB
set -eu
cd "$(dirname "$0")/.."
dest=${1:-.whl}
bash ../shared/gpu/wheels.sh "$dest" > /dev/null
# an abi3 wheel: the machine's own platform tag (manylinux_2_31) is the one llguidance >= 1.9 is built for
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest" 'llguidance>=1.9'
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  -d "$dest" jsonschema jsonschema-specifications referencing rpds-py attrs
ls "$dest" | grep -q '^llguidance-' || { echo "gpu_wheels.sh: no llguidance wheel in $dest" >&2; exit 1; }
du -sh "$dest"
