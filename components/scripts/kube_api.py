"""A pod's client for the Kubernetes API, standard library only: the API server's in-cluster address, its CA and the
pod's service account token (Kubernetes "Accessing the Kubernetes API from a Pod"). The scripts that run in pods
import it as components.scripts.kube_api: their ConfigMap ships it beside them in that layout (components/
pod_scripts.py)."""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Self

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT_SECONDS = 10  # one call; the scripts' callers retry on their own schedule


class ApiServer:
    """The cluster's API server, as a pod reaches it: its service address, CA and service account token."""

    def __init__(self, base_url: str, token_file: str, context: ssl.SSLContext | None) -> None:
        self.base_url, self.token_file, self.context = base_url.rstrip("/"), token_file, context

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ) -> Self:
        host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt")
        return cls(f"https://{host}:{port}", f"{SERVICE_ACCOUNT}/token", context)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Any:
        """One call; the answer's JSON (None when empty). Raises urllib.error.HTTPError on a refusal (403, 404, 409,
        422...) and URLError or OSError when the server cannot be reached."""
        url = self.base_url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with open(self.token_file, encoding="utf-8") as token:  # read per call: the kubelet rotates it
            bearer = token.read().strip()
        headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=self.context) as response:
            text = response.read()
        return json.loads(text) if text.strip() else None


def beat(name: str, directory: str) -> None:
    """Touch the heartbeat file `name` in `directory`, whose age the pod's probes read (components/pod_scripts.py
    beat_probes)."""
    path = os.path.join(directory, name)
    with open(path, "a", encoding="utf-8"):
        pass
    os.utime(path)
