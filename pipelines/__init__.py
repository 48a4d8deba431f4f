"""Planning, state, Prefect flows and the `historian` command."""
