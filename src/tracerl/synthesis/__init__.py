"""tracerl.synthesis."""
