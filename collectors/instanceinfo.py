"""neuron-monitor's ``instance_info`` (sys-tools.md §1.8): EC2 facts about the host.

On a real Neuron host they come from the instance metadata service (IMDSv2: a session token, then
one request per field), asked once at start-up with a short timeout so a host without IMDS (a
container without hop room, a laptop with a fixture tree) costs under a second and reports the
failure in ``error`` instead of hanging. A simulated instance has no EC2 identity: every field is
empty except ``instance_type``, the simulated type. ``NEURONSCOPE_IMDS=0`` skips the service;
``NEURONSCOPE_IMDS_ENDPOINT`` points elsewhere (tests).
"""

from __future__ import annotations

import urllib.error
import urllib.request

from neuronscope import settings

DEFAULT_ENDPOINT = "http://169.254.169.254"
TIMEOUT_S = 0.4
KEYS = ("instance_name", "instance_id", "instance_type", "instance_availability_zone",
        "instance_availability_zone_id", "instance_region", "ami_id", "subnet_id")
_PATHS = {
    "instance_id": "instance-id",
    "instance_type": "instance-type",
    "instance_availability_zone": "placement/availability-zone",
    "instance_availability_zone_id": "placement/availability-zone-id",
    "instance_region": "placement/region",
    "ami_id": "ami-id",
}
_CONDITIONAL = {"instance_name", "instance_availability_zone_id", "instance_region"}


def simulated_info(instance_type: str) -> dict[str, str]:
    return {**dict.fromkeys(KEYS, ""), "instance_type": instance_type, "error": ""}


def _get(url: str, token: str | None, timeout: float) -> str:
    request = urllib.request.Request(url, headers={"X-aws-ec2-metadata-token": token} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode().strip()


def imds_info(fallback_type: str, endpoint: str | None = None, timeout: float = TIMEOUT_S) -> dict[str, str]:
    """The fields from IMDS; on failure the fields that could not be read are empty and ``error``
    says why (``instance_type`` falls back to what the inventory found)."""
    info = {**dict.fromkeys(KEYS, ""), "instance_type": fallback_type, "error": ""}
    try:
        wanted = settings.IMDS.get()
    except settings.SettingError as exc:
        info["error"] = str(exc)
        return info
    if not wanted:
        return info
    base = (endpoint or settings.IMDS_ENDPOINT.get() or DEFAULT_ENDPOINT).rstrip("/")
    try:
        request = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            token: str | None = response.read().decode().strip()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        info["error"] = f"instance metadata service unreachable: {getattr(exc, 'reason', exc)}"
        return info
    failed = []
    for key, path in _PATHS.items():
        try:
            info[key] = _get(f"{base}/latest/meta-data/{path}", token, timeout)
        except (urllib.error.URLError, OSError, ValueError):
            if key not in _CONDITIONAL:
                failed.append(key)
            if key == "instance_type":
                info[key] = fallback_type
    try:
        mac = _get(f"{base}/latest/meta-data/mac", token, timeout)
        info["subnet_id"] = _get(f"{base}/latest/meta-data/network/interfaces/macs/{mac}/subnet-id",
                                 token, timeout)
    except (urllib.error.URLError, OSError, ValueError):
        failed.append("subnet_id")
    if failed:
        info["error"] = "could not read from instance metadata: " + ", ".join(failed)
    return info


__all__ = ["KEYS", "imds_info", "simulated_info"]
