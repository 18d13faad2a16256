"""tracerl.composition."""
