"""tracerl — TRACE: Turning Recurrent Agent failures into Capability-targeted training Environments."""

__version__ = "0.1.0"
