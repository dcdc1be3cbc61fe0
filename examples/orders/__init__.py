"""Example 1: JSON orders from Kafka, validated, to PostgreSQL (two-phase commit) and Kafka (transactions)."""
