#!/bin/bash
# The H200 device run behind BENCHMARKS.md: install gsrun, record the node,
# real-node lifecycle, efficiency validation, benchmarks (H2D copy, training,
# node costs, sampler, MPS). Results in $OUT
# (at most 8 files come back). Usage (device machine, repo root, as root):
#   bash tests/gpu/run_all.sh [STEPS]    STEPS: comma list of
#   record,real,eff,h2d,train,node,sampler,doctor,mps (default: all)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gsrun-out}; mkdir -p "$OUT"
STEPS=",${1:-record,real,eff,h2d,train,node,sampler,doctor,mps},"
BUDGET_S=${BUDGET_S:-560}
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
want() { [[ "$STEPS" == *",$1,"* ]]; }
log() { echo "=== $(date +%T) +$(( $(date +%s) - T0 ))s $*"; }
{
log install
python3 -m pip install -q --no-deps --no-index --no-compile --force-reinstall .whl/gsrun-*.whl || exit 3
which python3 gsrun gsrun-node gsrun-bind gseff
nvidia-smi --query-gpu=name,driver_version,uuid,compute_mode,mig.mode.current,persistence_mode --format=csv
cat /proc/sys/vm/swappiness /proc/sys/vm/dirty_ratio /sys/kernel/mm/transparent_hugepage/enabled
REC=/tmp/h200-real
pack() { (cd /tmp && tar czf "$OUT/h200-real.tar.gz" h200-real); }
if want record; then log record; python3 tests/gpu/record_real.py $REC; pack; fi
mkdir -p $REC
if want real; then log real_node; timeout $(( $(left) < 200 ? $(left) : 200 )) python3 tests/gpu/real_node.py --seconds ${REAL_S:-40} --out "$OUT/real_node.json" | tail -c 2500; fi
if want eff; then log efficiency; timeout 120 python3 tests/gpu/efficiency_real.py --out "$OUT/efficiency.json" | tail -c 1500; fi
if want h2d; then log h2d; timeout 100 python3 tests/bench/bench_h2d.py > "$OUT/bench_h2d.json"; tail -c 800 "$OUT/bench_h2d.json"; fi
if want train; then log train; timeout 150 python3 tests/bench/bench_train.py --rounds 2 --seconds 10 > "$OUT/bench_train.json"; head -c 600 "$OUT/bench_train.json"; fi
if want node; then log node; timeout 120 python3 tests/bench/bench_node.py > "$OUT/bench_node.json"; head -c 1500 "$OUT/bench_node.json"; fi
if want sampler && [ -f tests/bench/bench_sampler.py ]; then log bench_sampler; timeout 90 python3 tests/bench/bench_sampler.py --real > $REC/bench_sampler.txt 2>&1; tail -c 1500 $REC/bench_sampler.txt; pack; fi
if want doctor && gsrun-node doctor --help >/dev/null 2>&1; then log doctor; timeout 60 gsrun-node doctor --json > $REC/doctor.json 2>$REC/doctor.err; echo "doctor rc $?"; head -c 1500 $REC/doctor.json; pack; fi
if want mps; then L=$(left); log "mps (left ${L}s)"; if [ "$L" -gt 60 ]; then timeout $(( L - 10 )) python3 tests/bench/bench_mps.py --rounds 3 --duration-s ${MPS_S:-3} > "$OUT/bench_mps.json"; python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d.get('ratios'),d.get('aims'),d.get('error'))" "$OUT/bench_mps.json"; fi; fi
log "after: $(cat /proc/sys/vm/swappiness /proc/sys/vm/dirty_ratio) $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
nvidia-smi --query-gpu=compute_mode,mig.mode.current --format=csv,noheader
pgrep -a nvidia-cuda-mps || echo "no mps process"
log done
} 2>&1 | tee "$OUT/log.txt"
