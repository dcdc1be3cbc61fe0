"""Object storage: where the table sinks keep their data when a lake lives in a bucket, not a folder.

`s3` holds the connection (endpoint, region, credentials) and the few operations the sinks' protocols
need beyond a filesystem's: a put that only succeeds when the object is absent.
"""
