"""How the provider API server's errors read as ProviderErrors: admission refusals are final,
RBAC and quota refusals are retried."""

from __future__ import annotations

from gpufed.kube.client import KubeError
from vkprovider.forge.podpolicy import REASON
from vkprovider.remote.refusals import ADMISSION_REFUSED, refusal


def test_the_api_servers_admission_refusals_are_final() -> None:
    ours = KubeError(
        "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'gpufed-offload-policy' with binding "
        "'gpufed-offload-policy' denied request: privileged containers are refused (container main: "
        "securityContext.privileged=true); ask the provider to allow it in "
        "Tenant spec.policy.podSecurity.allowPrivileged",
        status=403,
    )
    err = refusal(ours, "the provider gpu-a refused the pod")
    assert (err.reason, err.retry) == (REASON, False)
    assert "privileged containers are refused (container main" in str(err)
    psa = KubeError('pods "p" is forbidden: violates PodSecurity "baseline:latest": privileged', status=403)
    assert (refusal(psa, "x").reason, refusal(psa, "x").retry) == (ADMISSION_REFUSED, False)
    # RBAC not yet in place (a twin namespace being bound) and quota stay retried.
    rbac = KubeError('pods is forbidden: User "gpufed:consumer:c" cannot create resource "pods"', status=403)
    assert refusal(rbac, "x").retry
    quota = KubeError('pods "p" is forbidden: exceeded quota: gpufed-grant', status=403)
    assert refusal(quota, "x").reason == "QuotaExceeded"


def test_transient_invalid_and_other_errors() -> None:
    unavailable = refusal(KubeError("service unavailable", status=503), "x")
    assert (unavailable.reason, unavailable.retry) == ("ProviderUnavailable", True)
    invalid = refusal(KubeError('Pod "p" is invalid: spec.containers: Required value', status=422), "x")
    assert (invalid.reason, invalid.retry) == ("InvalidPod", False)
    other = refusal(KubeError("conflict", status=409), "cannot update the twin")
    assert (other.reason, other.retry) == ("ProviderFailed", True)
    assert str(other).startswith("cannot update the twin: ")
