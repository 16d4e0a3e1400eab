"""What the slurmd epilog (:mod:`gsrun.epilog.main`) and EpilogSlurmctld
(:mod:`gsrun.epilog.ctld`) do: end the job's sampling, write the node summary,
undo every node change, merge the job summary, queue the report mail."""
