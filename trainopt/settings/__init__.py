"""The winning settings in production.

``record`` is the best.yaml schema, ``environment_check`` compares the measuring machine
with this one, ``production`` is the ``TrainSettings`` API and ``export`` writes the
settings as code for plain PyTorch, Lightning and Hugging Face, or as best.yaml.
"""
