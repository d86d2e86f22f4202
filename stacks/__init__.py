"""One stack per deployable unit; each reads the typed EnvironmentConfig."""
