"""Kafka as a resettable source: plan an epoch's offset ranges, then read exactly those ranges."""
