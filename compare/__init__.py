"""The judging layer: what --compare and --json make of a run's numbers, apart from the scripts that compute them.
verdicts.py: the article's numbers and conclusions beside this run's, each with a verdict; published_files.py:
whether a checkpoint's or a dataset's files are the ones huggingface.co publishes (docs/compare.md); record.py: what
--json writes, and judged(), the one call a script's conclude() makes here."""
