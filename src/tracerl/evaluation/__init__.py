"""tracerl.evaluation."""
