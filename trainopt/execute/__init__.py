"""Starting and driving trial processes: the runner, measurement sessions, slots and executors, Ray, the torchrun launch. Starts trial/ only by module name."""
