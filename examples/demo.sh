#!/bin/bash
# The quick-start demo: start the local two-node Slurm cluster (4 emulated
# GPUs per node), run `gsrun --gpus 8 --wait examples/train.py` as an
# unprivileged user, then print `gseff` for that job. Run as root on Debian 12/13.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
dir=${GSRUN_CLUSTER_DIR:-/var/tmp/gsrun-cluster}
venv=${GSRUN_VENV:-/opt/gsrun/venv}
user=${GSRUN_TEST_USER:-gsrun-test}

up_env=$("$repo/tests/cluster/up" "$@")   # stops here when the cluster does not come up
eval "$up_env"
install -o "$user" -m 0644 "$repo/examples/train.py" "$dir/work/train.py"
# only what tests/cluster/up printed: gsrun.toml is found beside SLURM_CONF
as_user() {
  runuser -u "$user" -- env -i HOME="$dir/work" PATH="$venv/bin:/usr/bin:/bin" \
    SLURM_CONF="$SLURM_CONF" LANG=C.UTF-8 "$@"
}
cd "$dir/work"
echo "+ gsrun --gpus 8 --wait examples/train.py   (as $user)"
set +e
as_user gsrun --gpus 8 --wait --output "$dir/work/train-%j.out" train.py 2> >(tee "$dir/work/demo.err" >&2)
rc=$?
set -e
sleep 0.2
job=$(grep -o 'submitted job [0-9]*' "$dir/work/demo.err" | awk '{print $3}' | tail -1)
[ -n "$job" ] || { echo "gsrun: demo: no job was submitted" >&2; exit 1; }
# the job summary is merged by EpilogSlurmctld right after the job ends
for _ in $(seq 60); do [ -e "$dir/gsrun-spool/jobs/$job/user-summary.json" ] && break; sleep 0.5; done
echo
echo "+ gseff $job   (as $user)"
as_user gseff "$job"
echo
echo "+ gseff $job   (as root, with only SLURM_CONF set)"
env -i PATH="$venv/bin:/usr/bin:/bin" SLURM_CONF="$SLURM_CONF" LANG=C.UTF-8 gseff "$job" | head -3
exit "$rc"
