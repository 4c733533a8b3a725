"""The one-knob-at-a-time search: the search itself, knob stages, the trial broker, its state, the trial store and progress."""
