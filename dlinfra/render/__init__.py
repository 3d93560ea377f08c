"""Pure renderers for configuration files that dlinfra ships to machines (no Pulumi import)."""
