"""The Helm charts the Platform installs, one module per chart: its values, the objects of its CRDs, its AWS documents.

Pure functions and constants, no resources. Values may hold `pulumi.Input`s, which Pulumi resolves where the dicts
are used as inputs. May import dlinfra.model, dlinfra.render and dlinfra.errors; never a component.
"""
