"""trainopt: find, with evidence, which training-speed settings make your PyTorch training faster."""

__version__ = "0.1.0"

# After __version__, which settings reads; settings imports torch only inside its methods,
# so ``import trainopt`` stays light.
from trainopt.settings import TrainSettings, load_settings  # noqa: E402

__all__ = ["__version__", "load_settings", "TrainSettings"]
