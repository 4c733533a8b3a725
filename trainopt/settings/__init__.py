"""The winning settings in production: the best.yaml schema, the TrainSettings API and the exports."""
