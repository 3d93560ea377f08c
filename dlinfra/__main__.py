"""`python -m dlinfra` and the `dlinfra` command: run by the warm server when one serves this code, else here.

Only the standard library and dlinfra.serving are imported before that choice, so a served command starts in
milliseconds; `dlinfra server start` (docs/server.md) starts the server.
"""

import os
import signal
import sys


def run() -> int:
    """Forward the command to the running server of this code, or run it in this process."""
    from dlinfra.serving import servers

    if servers.enabled() and sys.argv[1:2] != ["server"]:
        from dlinfra.serving.client import ServerLostError, call

        try:
            code = call(servers.dlinfra_server().socket, ["dlinfra", *sys.argv[1:]], forward=True)
        except ServerLostError as exc:
            print(f"dlinfra: {exc}; its output may be incomplete", file=sys.stderr)
            return 1
        if code is not None and code < 0:  # a signal ended the command: end the same way, as a shell expects
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            return 128 - code
        if code is not None:
            return code
        if servers.mode() == "require":
            print(
                "dlinfra: DLINFRA_SERVER=require, and no server serves this code; `dlinfra server start` starts one",
                file=sys.stderr,
            )
            return 1
    from dlinfra.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
