"""Code that runs in pods the platform declares, shipped in a ConfigMap (each module is one script, standard
library only)."""
