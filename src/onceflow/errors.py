"""Errors that onceflow raises on purpose: each says what is wrong and what to do about it."""


class OnceflowError(Exception):
    """Base of every error onceflow raises on purpose."""


class ConfigError(OnceflowError):
    """Configuration is missing or invalid; the message names the setting."""


class ServiceUnavailable(OnceflowError):
    """A required service (Kafka, PostgreSQL, the ledger) did not answer."""
