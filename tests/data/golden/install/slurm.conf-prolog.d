# --- gsrun: slurm.conf lines for Slurm 23.11.4 (from `gsrun-node install`) ---
# Same lines on every node and on the slurmctld host; then `scontrol reconfigure`
# (PrologFlags changes need a restart of slurmctld and every slurmd).
#
# PrologFlags: Alloc runs the prolog on every allocated node when the job is allocated, not at its first step, so tuning, MPS and the sampler are in place before the batch script starts and every node records a summary; Contain because ProctrackType=proctrack/cgroup: the job's cgroup (the 'extern' step) exists from allocation, so the sampler can find it; kept your flags (X11)
PrologFlags=X11,Alloc,Contain
# prolog.d layout: Slurm runs every program the glob matches (reverse alphabetical
# order for the prolog). Link gsrun's hooks in with:
#   ln -sfn /opt/gsrun/libexec/gsrun-prolog /etc/slurm/prolog.d/50-gsrun
#   ln -sfn /opt/gsrun/libexec/gsrun-epilog /etc/slurm/epilog.d/50-gsrun
Prolog=/etc/slurm/prolog.d/*
Epilog=/etc/slurm/epilog.d/*
# EpilogSlurmctld runs on the slurmctld host: it merges the node summaries into the
# job report and queues the mail (gsrun must be installed there too).
EpilogSlurmctld=/opt/gsrun/libexec/gsrun-epilog-ctld
# PrologEpilogTimeout: 120 s = the test's value
PrologEpilogTimeout=120
# --- end gsrun ---
