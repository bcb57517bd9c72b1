# Shared by the run_*_benchmarks.sh scripts: `step` runs one named step under its own
# time limit (SKIP="name ..." leaves steps out, ONLY="name ..." runs just those), and
# `write_env OUT` records the GPU and the torch and triton versions in OUT/env.txt.
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  case " ${SKIP:-} " in *" $name "*) echo "=== $name skipped"; return;; esac
  if [ -n "${ONLY:-}" ]; then
    case " $ONLY " in *" $name "*) ;; *) return;; esac
  fi
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout "$limit" "$@"; echo "=== $name exit $? $(date -u +%H:%M:%S)"
}

write_env() {  # write_env OUT_DIR
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  } > "$1/env.txt" 2>&1
}
