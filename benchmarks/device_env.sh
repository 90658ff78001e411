# Sourced by the GPU driver scripts: install carried wheels (.whl/) into /tmp/site, link the
# package-dir mapping of pyproject.toml (kernels/, envs/, conf/ -> kvrl/*) so the checkout imports
# as the installed package would, and set PYTHONPATH. No pip access is needed on the device.
export PYTHONUNBUFFERED=1
# Installed once per machine (flock: driver scripts started together on one host share /tmp/site).
if ls .whl/*.whl >/dev/null 2>&1; then
  ( command -v flock >/dev/null && flock 9; [ -f /tmp/site/.kvrl-wheels ] && [ "$(cat /tmp/site/.kvrl-wheels)" = "$(ls .whl)" ] || {
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && ls .whl > /tmp/site/.kvrl-wheels; } ) 9> /tmp/kvrl-wheels.lock || exit 1
  export PYTHONPATH=/tmp/site
fi
# -n: never a link inside an existing one (two scripts started at once race here; the loser finds the link made)
for d in kernels envs conf; do [ -e "kvrl/$d" ] || ln -sn "../$d" "kvrl/$d" 2>/dev/null || [ -e "kvrl/$d" ] || exit 1; done
export PYTHONPATH="$PWD:${PYTHONPATH:-}"

# GPU, driver, python/torch/triton and the commit, for a script's header (non-zero if torch is missing).
device_versions() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, end=' ')
try:
    import triton; print('triton', triton.__version__)
except ImportError:
    print('triton -')" || return 1
  git log -1 --format='commit %h %s' 2>/dev/null || true
}
