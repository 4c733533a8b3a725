"""Pure statistics over plain numbers: steady state, window summaries, paired rank intervals. numpy and scipy at most."""
