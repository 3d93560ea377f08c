"""dlinfra's CrossGuard rules: plain functions by area in `rules`, wrapped as Pulumi policies in `pack`."""
