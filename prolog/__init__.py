"""What the slurmd prolog does: validate the job, tune the node, start MPS /
MIG when asked, start the sampler, record it all. See :func:`gsrun.prolog.main.run`."""
