"""How an error of the provider's API server reads as a `ProviderError` the user sees.

Owns: the mapping of a `KubeError` from the provider to a `ProviderError` reason and retry
decision: transient -> `ProviderUnavailable` (retried); a quota's 403 -> `QuotaExceeded`; the
offload pod-security policy's refusal -> `forge.podpolicy.REASON`, another admission policy's or
Pod Security Admission's -> `AdmissionRefused`, an invalid pod (422) -> `InvalidPod` (these three are
deterministic: not retried); anything else -> `ProviderFailed`. The message keeps the API server's.

Does not: decide what to retry when (vkprovider.node does), or talk to any API.
"""

from __future__ import annotations

from gpufed.kube.client import KubeError
from peering import podsecurity
from vkprovider.forge import podpolicy
from vkprovider.node.provider import ProviderError

#: Reason of a pod the provider's API server refused at admission for another policy than gpufed's
#: (Pod Security Admission, another ValidatingAdmissionPolicy): deterministic, so not retried.
ADMISSION_REFUSED = "AdmissionRefused"


def refusal(e: KubeError, what: str) -> ProviderError:
    """`e` from the provider's API server while doing `what`, as the user should see it."""
    if e.transient:
        return ProviderError(f"{what}: {e}", reason="ProviderUnavailable")
    if e.status == 403 and "exceeded quota" in str(e):
        return ProviderError(f"{what}: {e}", reason="QuotaExceeded")
    if e.status in (403, 422) and f"ValidatingAdmissionPolicy '{podsecurity.POLICY_NAME}'" in str(e):
        return ProviderError(f"{what}: {e}", reason=podpolicy.REASON, retry=False)
    if e.status in (403, 422) and ("ValidatingAdmissionPolicy" in str(e) or "violates PodSecurity" in str(e)):
        return ProviderError(f"{what}: {e}", reason=ADMISSION_REFUSED, retry=False)
    if e.status == 422:
        return ProviderError(f"{what}: {e}", reason="InvalidPod", retry=False)
    return ProviderError(f"{what}: {e}", reason="ProviderFailed")
