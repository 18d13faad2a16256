"""tracerl.selection."""
