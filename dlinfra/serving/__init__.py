"""Floor 0: the warm servers that run dlinfra's commands and checkov in forks of a process that imported them once
(`forkserver`, standard library only, and `servers`, which of them this checkout has; docs/server.md).

Imports: the standard library, and `dlinfra.PROJECT_ROOT`; nothing of the floors above, since the `dlinfra` command
chooses between a server and its own process before it imports anything else.
"""
