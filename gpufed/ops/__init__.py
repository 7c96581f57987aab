"""Commands that span features, run with the operator's kubeconfigs: `gpufed peer` end to end,
`gpufed unpeer --force`, `gpufed doctor`, `gpufed pool`."""
