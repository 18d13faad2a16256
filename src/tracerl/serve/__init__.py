"""tracerl.serve."""
