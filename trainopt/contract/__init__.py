"""What crosses a process boundary: the spec, the trial protocol, the spec's references, the data-parallel job, slots and the process-boundary names."""
