"""Reading a task's sandbox files from its Mesos agent, as the Mesos web UI does.

The agent serves ``GET /files/read?path=VIRTUAL&offset=N&length=M`` with a JSON body
``{"data": "...", "offset": N}``; a task of a task group (default executor) has its sandbox at
``/frameworks/<framework>/executors/<executor>/runs/latest/tasks/<task>/`` in that namespace.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from peloton.errors import NotFound, Unavailable

# Where a task with GPUs reports the host indices of the GPUs it sees (written by the line
# peloton puts before its command: peloton.hostmgr.launch.gpu_report), relative to its sandbox.
GPU_REPORT = ".peloton/gpus"


def sandbox_path(framework_id: str, executor_id: str, task_id: str, name: str) -> str:
    """The virtual path of a task's sandbox file ``name``: a path relative to the sandbox
    (``stdout``, ``stderr``, :data:`GPU_REPORT`)."""
    return f"/frameworks/{framework_id}/executors/{executor_id}/runs/latest/tasks/{task_id}/{name}"


def read_file(
    address: str, path: str, offset: int, length: int, timeout: float = 5.0
) -> tuple[bytes, int]:
    """(data, offset) of up to ``length`` bytes of ``path`` at ``offset`` on an agent.

    NotFound if the agent has no such file (yet); Unavailable if it can't be reached.
    """
    query = urllib.parse.urlencode({"path": path, "offset": offset, "length": length})
    url = f"http://{address}/files/read?{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(f"no sandbox file {path} on agent {address}") from exc
        raise Unavailable(f"agent {address} answered HTTP {exc.code} for {path}") from exc
    except (OSError, ValueError) as exc:
        raise Unavailable(f"cannot read {path} from agent {address}: {exc}") from exc
    data = body.get("data", "")
    return data.encode("utf-8"), int(body.get("offset", offset))
