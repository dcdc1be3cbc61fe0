"""The ``onceflow`` command (`onceflow.cli.main`) and the commands that are only its own (`topics`)."""
