"""Peers run on the same data set and machine: Spark Structured Streaming and quix-streams."""
