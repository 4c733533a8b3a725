"""trainopt: find, with evidence, which training-speed settings make your PyTorch training faster."""

# The production settings API imports torch only inside its methods, so ``import trainopt`` stays light.
from trainopt.settings.production import TrainSettings, load_settings  # noqa: E402
from trainopt.version import __version__

__all__ = ["__version__", "load_settings", "TrainSettings"]
