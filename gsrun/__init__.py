"""gsrun: Slurm GPU-node tuning, NUMA binding and per-job GPU efficiency.

Layout (one import package, folders mapped by pyproject):

- ``gsrun.*``            core: errors, hostfs, cpulist, config, slurm, nvml, devices, topology, binding
- ``gsrun.prolog``       what the slurmd prolog does (prolog/)
- ``gsrun.epilog``       what the slurmd epilog and EpilogSlurmctld do (epilog/)
- ``gsrun.wrapper``      the user commands gsrun, gseff, gsrun-bind (wrapper/)
- ``gsrun.spank_py``     the SPANK plugin's C shim and Python hooks (spank_py/)
"""

__version__ = "0.1.0"
SUMMARY_SCHEMA = "gsrun.summary/1"
