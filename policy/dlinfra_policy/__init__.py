"""dlinfra's CrossGuard rules: plain functions in `rules`, wrapped as Pulumi policies in `pack`."""
