"""The torch side: everything that runs inside a trial process (worker, live arm, fork server, timed loop, applier, DDP rank, workloads)."""
