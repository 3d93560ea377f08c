"""Floor 4, the composition: which components each stack role gets (regional, in-cluster, global), reading the
fleet and the address plan through `context.StackContext`. `__main__.py` is the Pulumi program.

May import components, dlinfra.render, dlinfra.model and the bottom modules; never the offline engine or above.
"""
