"""`historian` commands of the live tail (pipelines/live): `tail`."""
