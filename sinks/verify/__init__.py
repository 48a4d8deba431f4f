"""Checking committed chunks against what a sink still holds (`sinks.base.Verifies`,
`historian verify`), one module per sink family: lake (markers against footers), sql
(chunk records against one COUNT per dataset), tables (Delta, Iceberg: the log's files
against footers, then rows per window); counts (rows per window against chunk records)."""
