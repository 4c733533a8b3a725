"""What a search leaves behind: results.json, the output folder and the report."""
