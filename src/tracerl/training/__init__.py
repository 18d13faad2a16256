"""tracerl.training."""
