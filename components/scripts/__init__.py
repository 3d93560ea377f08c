"""Code that runs on our machines rather than here: in pods the platform declares (shipped in a ConfigMap) and on
GPU machines (the GPU health check). Each module is one script, standard library only unless its docstring says
what else it needs."""
