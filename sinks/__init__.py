"""Where extracted data lands: a Parquet lake and a SQL warehouse, each exactly once."""
