"""Artifact sources (git, http, s3, volume) and the revision store."""
