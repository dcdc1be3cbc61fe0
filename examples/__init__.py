"""Example onceflow pipelines (import them as ``examples.<name>.pipeline:<SPEC>``)."""
