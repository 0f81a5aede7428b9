# Sourced on the GPU machine after `source .vllmkit-b/stage.sh` (../shared/gpu-vllm/README.md):
# installs vsup's wheel into /tmp/site beside vLLM 0.26 and supervisord (the install an operator
# has), and runs vsup from /tmp, outside the checkout. Build the wheel here first:
#   .venv/bin/python -m build --wheel --no-isolation -o .gpuwork .   (.gpuwork is git-ignored)
#   .venv/bin/python -m pip download tomlkit --no-deps -d .gpuwork    (vsup's one dependency
#   the kit lacks)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpuwork/*.whl 2>&1 | grep -v "already exists" | tail -2
export VSUP_HOME=/tmp/vsup-home PYTHONUNBUFFERED=1
mkdir -p "$VSUP_HOME" && chmod 700 "$VSUP_HOME"
cp "$here"/h200-*.toml /tmp/
cd /tmp || exit 1
python3 -c 'import vsup, supervisor, vllm; print("vsup", vsup.__version__, vsup.__file__);
print("supervisord package", supervisor.__file__); print("vllm", vllm.__version__)'
