"""The fleet file: what exists (regions, environments, sites, node pools, teams).

`schema` holds the frozen models and their derived views, `labels` the Kubernetes syntax rules they apply,
`checks` the checks that span several entries, and `load` the one way a file becomes a validated Fleet.
Pure planning code: no pulumi import; may import the rest of dlinfra.model and dlinfra.errors.
"""
