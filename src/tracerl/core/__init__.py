"""Core data model: messages, tool schemas, trajectories, the policy interface, file I/O."""
