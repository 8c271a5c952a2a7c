#!/usr/bin/env bash
# The engine on a CUDA machine, in one short run whose whole output goes to stdout: nvidia-smi, then
# bench/gpu_check.py: the card's measured bandwidth and matmul rate (beside its nominal figures), fidelity of the
# attention paths gather and flex (against each other, the CPU's float32 and transformers), then the engine at real
# sizes (Llama-3.2-1B's and Qwen3-8B's shapes, random bfloat16 weights made on the GPU): decode at batch 64 with
# 2k-token contexts first, prefill, then decode at batch 1 / 8 / 64 / 256 with 512 and 4k-token contexts, each row
# against its bound (HBM bandwidth for decode, matmul rate for prefill) with the ratio, as a table line and a JSON
# line (docs/performance.md, "GPU check"). Made for a lent GPU machine with no network and minutes of budget: every
# step that could hang has a timeout, the whole run stops within BUDGET_S, and the rows that matter most come first,
# each printed as it is measured. Without a CUDA device it says so and exits 0. Arguments go to gpu_check.py (e.g.
# --models llama-3.2-1b --parts done,grid); GPU_CHECK_COMMIT names the commit where the tree came without .git.
# Run: bash bench/gpu_check.sh
set -uo pipefail
exec 2>&1
BUDGET_S=420
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! timeout 30 nvidia-smi -L >/dev/null 2>&1; then
  echo "no CUDA device: nothing to check"
  exit 0
fi
echo "== nvidia-smi"
timeout 30 nvidia-smi

# A Python whose torch sees the GPU and which can import the engine (the repo is on its path from here).
probe='import torch, inference.engine.loaders.loading; raise SystemExit(0 if torch.cuda.is_available() else 3)'
candidates=("$root/.venv/bin/python" "$(command -v python3 || true)")
find_python() {
  local py
  for py in "${candidates[@]}"; do
    if [ -x "$py" ] && timeout 60 "$py" -c "$probe" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

if ! python="$(find_python)"; then
  # Creating .venv needs PyPI; without a network pip fails, so it gets few retries and a short limit.
  echo "== no Python with CUDA torch and the engine's packages: trying scripts/bootstrap (at most 150 s)"
  PIP_RETRIES=1 PIP_TIMEOUT=10 timeout 150 bash scripts/bootstrap
  echo "bootstrap exit status: $?"
  if ! python="$(find_python)"; then
    echo "no usable Python; what each candidate says (exit status 3: torch does not see a CUDA device):"
    for py in "${candidates[@]}"; do
      [ -x "$py" ] || { echo "-- $py: not found"; continue; }
      echo "-- $py"
      timeout 60 "$py" -c "$probe" 2>&1 | tail -n 3
      echo "exit status ${PIPESTATUS[0]}"
    done
    exit 1
  fi
fi

left=$((BUDGET_S - SECONDS))
if [ "$left" -lt 60 ]; then
  echo "finding a Python took $SECONDS s of the run's $BUDGET_S: too little left to check anything"
  exit 1
fi
echo "== $python bench/gpu_check.py (at most $left s)"
timeout "$left" "$python" -u bench/gpu_check.py "$@"
status=$?
if [ "$status" -eq 124 ]; then
  echo "gpu_check.py stopped after $left s: the run's budget of $BUDGET_S s was spent"
fi
exit "$status"
