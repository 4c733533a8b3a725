"""Pure statistics over plain numbers: steady state, window summaries, paired intervals, exact signed-rank kernels. numpy and scipy at most."""
