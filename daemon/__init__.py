"""The node daemon: one root process per node that runs the Slurm hooks and serves the SPANK
plugin's step plans (server), and its C client (client.c, client.h; built by build)."""
