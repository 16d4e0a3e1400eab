"""The admin's side of gsrun: the `gsrun-node` command (install, doctor, status, restore,
prune, mail, config, the daemon's verbs) and its entry point, which also hands the hooks
to their step tables."""
