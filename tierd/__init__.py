"""tierd: one namespace through FUSE, S3 and admin doors over tiered storage."""

__version__ = "0.1.0"
