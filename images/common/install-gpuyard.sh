#!/bin/sh
# Install gpuyard into the image's Python, keeping the torch the base image ships.
#   usage: install-gpuyard.sh SOURCE_DIR MODULE...
# torch must equal pyproject.toml's pin: a base without torch gets the pinned one
# from $TORCH_INDEX_URL, a base with another version fails the build. Then the
# trainer's runtime requirements (images/common/requirements.txt) and the package
# itself without its dependencies (Pulumi and moto are not for training pods), and
# each MODULE must import.
set -eu
src=$1
shift
# pip builds in the source tree; build a copy the installing user can write to.
work=$(mktemp -d)
cp -R "$src/." "$work"
src=$work
py=${PYTHON:-python3}
pin=$("$py" - "$src/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print(next(d.split("==", 1)[1] for d in deps if d.startswith("torch==")))
PY
)
if ! "$py" -c "import torch" 2>/dev/null; then
    "$py" -m pip install --no-cache-dir "torch==$pin" --index-url "${TORCH_INDEX_URL:?the base has no torch: set TORCH_INDEX_URL}"
fi
"$py" - "$pin" <<'PY'
import sys, torch
if torch.__version__.split("+")[0] != sys.argv[1]:
    sys.exit(f"the base image has torch {torch.__version__}, pyproject.toml pins {sys.argv[1]}: change one of them")
PY
"$py" -m pip install --no-cache-dir -r "$src/images/common/requirements.txt"
"$py" -m pip install --no-cache-dir --no-deps "$src"
rm -rf "$work"
cd /
for module in "$@"; do
    "$py" -c "import $module"
done
